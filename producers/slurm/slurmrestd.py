"""The one client of slurmrestd (auth/jwt): ``GET /slurm/<api>/job/<id>`` and ``.../jobs``,
read-only, each with a timeout and a size limit. The token is a SecretStr, sent in
``X-SLURM-USER-TOKEN`` and never logged. Its answers have the shape of ``squeue --json`` (a
``jobs`` list; squeue.py reads them): a running job's ``gres_detail`` names its GPU indices per
node (``gpu:2(IDX:0-1)``), a finished job's is empty (Slurm 26.05.3,
../shared/reference/slurm-26.md); ``.../jobs`` lists ended jobs too (seen on 26.05.3)."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

#: a job's answer is a few KiB (a het job's, more); every job's, some KiB per job
MAX_ANSWER_BYTES = 8 << 20
MAX_LISTING_BYTES = 512 << 20


class RestError(Exception):
    """slurmrestd did not answer, refused, or answered something too large."""


class SlurmRestd:
    def __init__(self, url: str, token: SecretStr, api: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.api = api
        self.timeout_s = timeout_s
        self._session: Any = None

    async def job(self, job_id: str) -> str:
        return await self._get(f"job/{job_id}", MAX_ANSWER_BYTES)

    async def jobs(self) -> str:
        """Every job slurmctld holds (``GET /slurm/<api>/jobs``)."""
        return await self._get("jobs", MAX_LISTING_BYTES)

    async def _get(self, path: str, limit: int) -> str:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        url = f"{self.url}/slurm/{self.api}/{path}"
        headers = {"X-SLURM-USER-TOKEN": self.token.get_secret_value()}
        try:
            async with self._session.get(url, headers=headers) as answer:
                body = await answer.content.read(limit + 1)
                if answer.status != 200:
                    raise RestError(f"{url} answered {answer.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RestError(f"{url}: {exc or type(exc).__name__}") from None
        if len(body) > limit:
            raise RestError(f"{url}: an answer larger than {limit} bytes")
        return body.decode("utf-8", "replace")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
