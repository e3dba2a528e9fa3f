"""HTTP API blueprints, one per domain."""
