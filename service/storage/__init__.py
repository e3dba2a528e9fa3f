"""Persistence: the system of record on PostgreSQL (the budget ledger, releases, audit
events, keys, analyses), Valkey's key names (the job broker, rate limits, caches: what may
be lost), the files of datasets, release documents and tables, and the reader of the old
Valkey store that ``privrelease migrate-from-valkey`` moves. Nothing here knows HTTP or a
mechanism."""
