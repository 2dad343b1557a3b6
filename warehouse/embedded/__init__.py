"""The embedded warehouse: ClickHouse's engine (chDB) in a confined process of its own, behind
its HTTP interface. Importing the package loads neither: ``server`` and ``serve`` need the
``local`` extra, ``users`` and ``password`` nothing but the core."""

from __future__ import annotations

from gpugap.warehouse.embedded.users import User, users_from

__all__ = ["User", "users_from"]
