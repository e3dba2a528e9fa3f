"""The command line comes with the client alone (issue #28 item 5).

An analyst who installs only ``privrelease-client`` gets its console script; the server's
``privrelease`` offers the same commands beside its own. The console script runs here as
the installed one would (its ``[project.scripts]`` entry point) in a Python that cannot
import the server: isolated (``-I -S``: no PYTHONPATH, no working directory, no .pth
file such as the editable install's finder), with the client's sources and the installed
third-party packages only, and ``service``, ``workers`` and ``mechanisms`` refused.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from click.testing import CliRunner
from privrelease_client import cli as client_cli

from service.processes import cli as server_cli

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
SERVER_ONLY = ("service", "workers", "mechanisms")
#: the top-level client commands (groups and leaves) an analyst looks for
CLIENT_COMMANDS = {"datasets", "budget", "keys", "release", "analyses", "jobs", "estimate",
                   "ledger", "audit", "mechanisms", "health", "openapi", "completion"}
SERVER_COMMANDS = set(server_cli.SERVER_COMMANDS)

# run in the child: the entry point as a generated console script calls it, its exit
# status passed on; fails if anything of the server was imported on the way
_CHILD = """
import importlib, sys
sys.path[:0] = {paths!r}

class Refuse:
    '''The server's packages are not installed here.'''
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
sys.argv[0] = {prog!r}
module, _, func = {entry!r}.partition(":")
code = getattr(importlib.import_module(module), func)()
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
assert not leaked, leaked
sys.exit(code)
"""


def _entry_point() -> tuple[str, str]:
    scripts = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"privrelease-client"}  # never `privrelease`: the server's
    return "privrelease-client", scripts["privrelease-client"]


def client_alone(*args: str, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """``privrelease-client ARGS`` where only the client and its dependencies import."""
    prog, entry = _entry_point()
    paths = [str(CLIENT / "src"), *dict.fromkeys(sysconfig.get_paths()[k]
                                                 for k in ("purelib", "platlib"))]
    code = _CHILD.format(paths=paths, blocked=SERVER_ONLY, prog=prog, entry=entry)
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, *args], cwd=CLIENT,
                          env=env if env is not None else {}, capture_output=True,
                          text=True, timeout=60)


def _listed(help_text: str) -> set[str]:
    """The command names of a Click ``--help`` page's Commands section."""
    section = help_text.split("Commands:", 1)[1]
    return {line.split()[0] for line in section.splitlines()
            if line.startswith("  ") and not line.startswith("   ")}  # not a wrapped line


def test_the_console_script_lists_the_client_commands_without_the_server() -> None:
    """Catches the CLI importing anything of the server (it would not start for an analyst
    with only the client) and a client command missing from ``privrelease-client``."""
    done = client_alone("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: privrelease-client [OPTIONS] COMMAND")
    assert _listed(done.stdout) == CLIENT_COMMANDS


def test_the_console_script_alone_runs_commands() -> None:
    """Its version, its own completion variable, and a usage error found before any
    request (exit 2), all without the server's packages."""
    version = client_alone("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"privrelease-client {client_cli.__version__}\n"
    script = client_alone("completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_PRIVRELEASE_CLIENT_COMPLETE=bash_complete" in script.stdout
    nokey = client_alone("datasets", "list", env={"PRIVRELEASE_URL": "http://127.0.0.1:1"})
    assert (nokey.returncode, nokey.stdout) == (2, "")
    assert nokey.stderr == "error: no API key: pass --key or set PRIVRELEASE_KEY\n"


def test_importing_the_client_loads_no_command_line() -> None:
    """A notebook's ``import privrelease_client`` stays light: click and rich are loaded by
    the command line only."""
    code = ("import sys; sys.path[:0] = {paths!r}; import privrelease_client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'rich')))")
    paths = [str(CLIENT / "src"), sysconfig.get_paths()["purelib"]]
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code.format(paths=paths)],
                          cwd=CLIENT, env={}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr


def test_privrelease_offers_every_client_command_and_its_own() -> None:
    """Catches the server's ``privrelease`` losing a client command, and the server's
    commands leaking into the client's own group (it is copied, not changed)."""
    for name, cmd in client_cli.cli.commands.items():
        assert server_cli.cli.commands[name] is cmd
    assert set(server_cli.cli.commands) == CLIENT_COMMANDS | SERVER_COMMANDS
    assert set(client_cli.cli.commands) == CLIENT_COMMANDS
    shown = CliRunner().invoke(server_cli.cli, ["--help"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("Usage: privrelease [OPTIONS] COMMAND")
    assert _listed(shown.stdout) == CLIENT_COMMANDS | SERVER_COMMANDS
