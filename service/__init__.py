"""privrelease service: HTTP API, auth, ledger, dataset store and CLI."""
