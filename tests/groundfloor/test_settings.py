import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpugap.cli import main
from gpugap.groundfloor.settings import KafkaSettings, load
from gpugap.schemas.errors import ConfigError


def test_env_prefix_per_component(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_KAFKA_BOOTSTRAP", "broker-1:9093")
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_DATABASE", "capacity")
    monkeypatch.setenv("GPUGAP_CLUSTER", "east")
    s = load()
    assert (s.kafka.bootstrap, s.clickhouse.database, s.cluster) == (
        "broker-1:9093",
        "capacity",
        "east",
    )


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        load().kafka.bootstrap = "x:1"  # type: ignore[misc]


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_KAFKA_LINGER_MS", "-5")
    monkeypatch.setenv("GPUGAP_SERVICES_KAFKA_PORT", "http")
    with pytest.raises(ConfigError) as err:
        load()
    assert "GPUGAP_KAFKA_LINGER_MS" in str(err.value)
    assert "GPUGAP_SERVICES_KAFKA_PORT" in str(err.value)


def test_secrets_from_env_or_file_are_masked_in_config_show(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_file = tmp_path / "kafka-password"
    secret_file.write_text("file-secret-456\n")
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD", "env-secret-123")
    monkeypatch.setenv("GPUGAP_KAFKA_SASL_PASSWORD_FILE", str(secret_file))
    s = load()
    assert s.clickhouse.password is not None
    assert s.clickhouse.password.get_secret_value() == "env-secret-123"
    assert s.kafka.sasl_password is not None
    assert s.kafka.sasl_password.get_secret_value() == "file-secret-456"
    assert "env-secret-123" not in repr(s) and "file-secret-456" not in repr(s)
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "env-secret-123" not in out and "file-secret-456" not in out
    shown = json.loads(out)
    assert shown["clickhouse"]["password"] == "**********"
    assert shown["kafka"]["sasl_password"] == "**********"


def test_the_read_only_users_password_comes_from_a_file_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_file = tmp_path / "reader-password"
    secret_file.write_text("reader-secret-789\n")
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_READONLY_PASSWORD_FILE", str(secret_file))
    s = load()
    assert s.clickhouse.readonly_password is not None
    assert s.clickhouse.readonly_password.get_secret_value() == "reader-secret-789"
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "reader-secret-789" not in out
    assert json.loads(out)["clickhouse"]["readonly_password"] == "**********"
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_READONLY_PASSWORD_FILE", str(tmp_path / "missing"))
    assert main(["config", "show"]) == 2
    assert "cannot read the read-only user's password from" in capsys.readouterr().err


def test_unreadable_secret_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUGAP_CLICKHOUSE_PASSWORD_FILE", "/nonexistent/pw")
    assert main(["config", "show"]) == 2
    assert "cannot read the ClickHouse password from /nonexistent/pw" in capsys.readouterr().err


def test_sasl_options_reach_the_client() -> None:
    opts = KafkaSettings(
        bootstrap="b:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="p",
    ).client_options()  # type: ignore[arg-type]
    assert opts["sasl_plain_password"] == "p" and opts["security_protocol"] == "SASL_SSL"
