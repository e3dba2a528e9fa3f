"""Drawings through the client and the CLI (issue #18 §3/§4): release SVG, analysis PNG and
SVG, ``Analysis.plot()``, ``privrelease analyses plot``, ``health`` and ``openapi``,
against a scripted HTTP server (the real client, real sockets)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from privrelease_client import Analysis
from privrelease_client import cli as client_cli

from tests.unit.test_client import Script, answer, client, problem, server

__all__ = ["server"]  # the scripted server fixture, used here

PNG = b"\x89PNG\r\n\x1a\n"
SVG = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"></svg>'
ANALYSIS = {"id": "ana_1", "release_id": "rel_1", "analysis": "npmle", "status": "succeeded",
            "result": {}}


def _png(width: int = 30, height: int = 20) -> bytes:
    """A real PNG of ``width`` x ``height`` (matplotlib must decode what it shows)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    out = io.BytesIO()
    Figure(figsize=(width / 10, height / 10), dpi=10).savefig(out, format="png")
    return out.getvalue()


def test_plot_methods_ask_for_their_route_and_type(server: tuple[str, Script]) -> None:
    """Each method asks its own path with its media type and returns the bytes unchanged
    (catches a method that asks for the PNG when the SVG is wanted)."""
    url, script = server
    script.answers = [answer(200, SVG, content_type="image/svg+xml"),
                      answer(200, PNG, content_type="image/png"),
                      answer(200, SVG, content_type="image/svg+xml")]
    c = client(url)
    assert c.release_plot_svg("rel_1") == SVG
    assert c.analysis_plot("rel_1", "ana_1") == PNG
    assert c.analysis_plot_svg("rel_1", "ana_1") == SVG
    assert [(s.path, s.headers["Accept"]) for s in script.seen] == [
        ("/v1/releases/rel_1/plot.svg", "image/svg+xml"),
        ("/v1/releases/rel_1/analyses/ana_1/plot.png", "image/png"),
        ("/v1/releases/rel_1/analyses/ana_1/plot.svg", "image/svg+xml")]


def test_analysis_plot_saves_by_suffix_and_shows_the_servers_png(
        server: tuple[str, Script], tmp_path: Path) -> None:
    """``plot(path)`` writes the server's SVG or PNG by the suffix; ``plot()`` shows the
    server's PNG on axes at its own size (catches showing a local redraw instead)."""
    url, script = server
    png = _png()
    script.answers = [answer(200, SVG, content_type="image/svg+xml"),
                      answer(200, png, content_type="image/png"),
                      answer(200, png, content_type="image/png")]
    obj = Analysis(client(url), ANALYSIS)
    assert obj.plot(tmp_path / "a.svg") == tmp_path / "a.svg"
    assert (tmp_path / "a.svg").read_bytes() == SVG
    obj.plot(tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes() == png
    ax = obj.plot()
    shown = ax.get_images()[0].get_array()
    assert shown.shape[:2] == (20, 30) and not ax.axison
    assert [s.path.rsplit("/", 1)[1] for s in script.seen] == ["plot.svg", "plot.png",
                                                               "plot.png"]


def test_cli_plots_write_the_format_the_file_names(server: tuple[str, Script],
                                                   tmp_path: Path) -> None:
    """`analyses plot` and `release plot` write SVG for .svg, PNG otherwise, and say how
    many bytes went where (catches a command that ignores the suffix)."""
    url, script = server
    script.answers = [answer(200, SVG, content_type="image/svg+xml"),
                      answer(200, PNG, content_type="image/png"),
                      answer(200, SVG, content_type="image/svg+xml")]
    auth = ["--url", url, "--key", "pr_test_key"]
    runner = CliRunner()
    for args, name, body in (
            (["analyses", "plot", "rel_1", "ana_1"], "a.svg", SVG),
            (["analyses", "plot", "rel_1", "ana_1"], "a.png", PNG),
            (["release", "plot", "rel_1"], "r.svg", SVG)):
        out = tmp_path / name
        result = runner.invoke(client_cli.cli, [*args, "-o", str(out), *auth])
        assert result.exit_code == 0, result.output
        assert out.read_bytes() == body
        assert result.stdout.strip() == f"{len(body)} bytes -> {out}"
    assert [s.path for s in script.seen] == ["/v1/releases/rel_1/analyses/ana_1/plot.svg",
                                             "/v1/releases/rel_1/analyses/ana_1/plot.png",
                                             "/v1/releases/rel_1/plot.svg"]


def test_cli_health_and_openapi(server: tuple[str, Script], tmp_path: Path) -> None:
    """`health` reports both probes and exits 1 when not ready, with the server's reason;
    `openapi -o` writes the document (catches a health command that hides a 503)."""
    url, script = server
    auth = ["--url", url, "--key", "pr_test_key"]
    runner = CliRunner()
    script.answers = [answer(200, {"status": "ok"}),
                      answer(200, {"service": "privrelease", "version": "1.2.3", "links": {}}),
                      answer(200, {"status": "ready", "workers": 1})]
    ok = runner.invoke(client_cli.cli, ["health", "--json", *auth])
    assert ok.exit_code == 0 and json.loads(ok.stdout) == {
        "version": "1.2.3", "healthz": {"status": "ok"},
        "readyz": {"status": "ready", "workers": 1}}
    assert [s.path for s in script.seen] == ["/healthz", "/", "/readyz"]
    script.seen.clear()
    script.answers = [answer(200, {"status": "ok"}), problem(404, "not_found", "no route"),
                      problem(503, "unavailable", "no worker is running")]
    down = runner.invoke(client_cli.cli, ["health", *auth])
    assert down.exit_code == 1
    assert down.stderr.strip().splitlines()[-1] == (
        "error: not ready: unavailable: no worker is running")
    doc = {"openapi": "3.0.3", "paths": {"/v1/jobs": {}, "/v1/keys": {}}}
    script.answers = [answer(200, doc)]
    out = tmp_path / "openapi.json"
    result = runner.invoke(client_cli.cli, ["openapi", "-o", str(out), *auth])
    assert result.exit_code == 0 and json.loads(out.read_text()) == doc
    assert result.stdout.strip() == f"2 paths -> {out}"


@pytest.mark.parametrize("suffix", [".SVG", ".svg"])
def test_release_plot_path_svg_suffix_any_case(server: tuple[str, Script], tmp_path: Path,
                                               suffix: str) -> None:
    url, script = server
    script.answers = [answer(200, {"id": "rel_1", "status": "succeeded"}),
                      answer(200, SVG, content_type="image/svg+xml")]
    c = client(url)
    c.release("rel_1").plot(tmp_path / f"r{suffix}")
    assert script.seen[-1].path == "/v1/releases/rel_1/plot.svg"
