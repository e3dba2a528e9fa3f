"""gunicorn settings for `gunicorn -c deploy/gunicorn.conf.py 'service.app:create_app()'`.

`privrelease api` uses the same values (service/server.py); keep them in sync.
"""

import os

bind = os.environ.get("PRIVRELEASE_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("PRIVRELEASE_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = 8
timeout = 60
graceful_timeout = 10
keepalive = 5
errorlog = "-"
loglevel = "warning"
