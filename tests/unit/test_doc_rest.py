"""docs/rest.md names every endpoint gpuspawner adds to the hub, and only those.

Guards docs/rest.md: "Every endpoint gpuspawner adds to the hub". The routes are those
``configure(c)`` registers (``c.JupyterHub.extra_handlers``, served under ``/hub``); an
endpoint is a heading such as "### `GET /hub/api/gpuspawner/quotas`", where ``[/{server}]``
stands for the path with and without that part. Each route must be named with every
method its handler answers, each named endpoint must reach a handler that answers its
method, and the scope a handler checks must be named in its section (pure: builds no hub)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from tornado.web import RequestHandler
from traitlets.config import Config

from gpuspawner.allocator.refusals import AllocationRefused, Refusal
from gpuspawner.core.options import KEYS
from gpuspawner.hubconfig import configure
from gpuspawner.web import api

PAGE = Path(__file__).resolve().parents[2] / "docs" / "rest.md"
METHODS = ("get", "post", "put", "patch", "delete")
HEADING = re.compile(r"^### `(GET|POST|PUT|PATCH|DELETE) (/\S+?)`\s*$")
PARAMETER = re.compile(r"\{\w+\}")
SCOPES = {"ADMIN_SCOPE": api.ADMIN_SCOPE, "REPORT_SCOPE": api.REPORT_SCOPE}


def routes() -> list[tuple[str, type]]:
    """(the path's pattern under /hub, its handler) for each route configure(c) registers."""
    c = Config()
    configure(c)  # outside an event loop: registers, starts nothing
    return [("/hub" + pattern, handler) for pattern, handler, *_ in c.JupyterHub.extra_handlers.get_value([])]


def answers(handler: type) -> set[str]:
    """The methods ``handler`` itself answers (tornado's default answers 405)."""
    return {m.upper() for m in METHODS if getattr(handler, m) is not getattr(RequestHandler, m)}


def endpoints() -> dict[tuple[str, str], str]:
    """(method, path) of each endpoint heading -> its section's text, after the text that
    opens the ``##`` part it is in (the admins' part names their scope once for all)."""
    found: dict[tuple[str, str], str] = {}
    opening, heading, section, fenced, opens = "", None, [], False, False
    for line in [*PAGE.read_text().splitlines(), "## end"]:
        fenced = fenced != line.startswith("```")
        if fenced or not re.match(r"#{2,3} ", line):
            section.append(line)
            continue
        if heading is not None:
            method, path = heading
            optional = re.fullmatch(r"(.*)\[(/[^\]]+)\]", path)
            for p in [optional[1], optional[1] + optional[2]] if optional else [path]:
                assert (method, p) not in found, f"docs/rest.md names {method} {p} twice"
                found[(method, p)] = opening + "\n".join(section)
        elif opens:
            opening = "\n".join(section)  # the text between the part's heading and its first endpoint
        opens = line.startswith("## ")
        opening = "" if opens else opening
        match = HEADING.match(line)
        heading, section = (match.groups() if match else None), []
    return found


def route_of(path: str, registered: list[tuple[str, type]]) -> tuple[str, type] | None:
    sample = PARAMETER.sub("x", path)
    return next(((p, h) for p, h in registered if re.fullmatch(p, sample)), None)


def scopes_checked(handler: type, method: str) -> set[str]:
    """The scopes ``handler``'s ``method`` checks: ``self.require(...)`` and ``@needs_scope(...)``,
    in the method or in a method of the handler's own class that it calls (``reporter``)."""
    source = inspect.getsource(inspect.unwrap(getattr(handler, method.lower())))
    for called in set(re.findall(r"self\.(\w+)\(", source)) & set(vars(handler)):
        source += inspect.getsource(getattr(handler, called))
    return {SCOPES[name] for name in re.findall(r"self\.require\((\w+)\)", source)} | set(
        re.findall(r"@needs_scope\(\"([^\"]+)\"\)", source)
    )


def test_every_registered_route_is_in_the_page_with_each_method_it_answers():
    registered, named = routes(), endpoints()
    assert len(registered) >= 15 and len(named) >= 15  # the page and the parser still find them
    for pattern, handler in registered:
        methods = {method for (method, path) in named if route_of(path, registered) == (pattern, handler)}
        assert methods & answers(handler), f"docs/rest.md has no endpoint for {pattern} ({handler.__name__})"
    for handler in {h for _, h in registered}:
        named_for = {method for (method, path) in named if (route_of(path, registered) or (None, None))[1] is handler}
        missing = answers(handler) - named_for
        assert not missing, f"docs/rest.md does not name {sorted(missing)} of {handler.__name__}"


def test_every_endpoint_in_the_page_is_registered_and_answers_its_method():
    registered = routes()
    for method, path in endpoints():
        route = route_of(path, registered)
        assert route is not None, f"docs/rest.md names {method} {path}, which gpuspawner does not register"
        assert method in answers(route[1]), (
            f"docs/rest.md names {method} {path}; {route[1].__name__} does not answer it"
        )


def test_each_endpoints_section_names_the_scope_its_handler_checks():
    registered = routes()
    for (method, path), text in endpoints().items():
        route = route_of(path, registered)
        assert route is not None, f"docs/rest.md names {method} {path}, which gpuspawner does not register"
        for scope in scopes_checked(route[1], method):
            assert f"`{scope}`" in text, f"docs/rest.md, {method} {path}: the scope {scope} is not named"


def test_the_user_options_table_names_exactly_the_keys_the_spawner_takes():
    """Guards docs/rest.md, "User options": its table of keys is core/options.py's KEYS."""
    table = PAGE.read_text().partition("## User options")[2].partition("\n## ")[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == set(KEYS)


def test_the_user_options_answers_give_the_status_of_a_refusal_for_now_and_of_one_for_ever():
    """Guards docs/rest.md, "User options": "Refused for now: none is free" and "ask for
    what the cluster can never give" answer the statuses the allocator's refusals carry."""
    table = PAGE.read_text().partition("## User options")[2].partition("\n## ")[0]
    for refusal, words in ((Refusal.TOTAL_FREE_BELOW, "Refused for now"), (Refusal.UNKNOWN_MODEL, "can never give")):
        status = AllocationRefused("", refusal).status
        assert re.search(rf"^\| {status} \| [^\n]*{words}", table, re.M), f"docs/rest.md: {words!r} is not {status}"
