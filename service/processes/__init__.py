"""The processes: the ``privrelease`` command, the standalone supervisor, gunicorn
and its worker class, the embedded Valkey, logging and metrics of every process."""
