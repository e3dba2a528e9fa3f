"""Persistence: the budget ledger (Lua scripts in Valkey), the Valkey keys and
indexes, the job broker, and the files of datasets, release documents, tables and
the audit archive. Nothing here knows HTTP or a mechanism."""
