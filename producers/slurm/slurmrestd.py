"""The one client of slurmrestd (auth/jwt): ``GET /slurm/<api>/job/<id>``, read-only, with a
timeout and a size limit. The token is a SecretStr, sent in ``X-SLURM-USER-TOKEN`` and never
logged. Its answer has the shape of ``squeue --json`` (a ``jobs`` list; squeue.py reads it):
a running job's ``gres_detail`` names its GPU indices per node (``gpu:2(IDX:0-1)``), a
finished job's is empty (Slurm 26.05.3, ../shared/reference/slurm-26.md)."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

#: a job's answer is a few KiB; a het job's or an array's, more
MAX_ANSWER_BYTES = 8 << 20


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
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        url = f"{self.url}/slurm/{self.api}/job/{job_id}"
        headers = {"X-SLURM-USER-TOKEN": self.token.get_secret_value()}
        try:
            async with self._session.get(url, headers=headers) as answer:
                body = await answer.content.read(MAX_ANSWER_BYTES + 1)
                if answer.status != 200:
                    raise RestError(f"{url} answered {answer.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RestError(f"{url}: {exc or type(exc).__name__}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise RestError(f"{url}: an answer larger than {MAX_ANSWER_BYTES} bytes")
        return body.decode("utf-8", "replace")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
