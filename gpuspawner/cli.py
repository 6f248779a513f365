"""``gpuspawner``: the admin's command line, talking to a running hub's API.

    gpuspawner alloc-map [--json]        who holds which share of which GPU
    gpuspawner rescan [--json]           reconcile with the swarm's services, then the map
    gpuspawner usage [--since T] [--until T] [--by user|model|reason] [--json]   GPU-hours
    gpuspawner doctor [--json]           known misconfigurations, each with its fix (exit 1 on errors)
    gpuspawner idle [--json]             who holds GPUs and is idle now, and GPU processes no holder owns
    gpuspawner line [--json]             who waits in line for which model, in order
    gpuspawner line --remove USER[/SERVER]  take a request out of the line (its wait ends, saying so)
    gpuspawner agent-token HOST          issue HOST's node agent a token (printed once; rotates)
    gpuspawner agent-token --revoke HOST revoke it
    gpuspawner agent-token --list        the hosts that have one (never the tokens)

The hub is found from ``--hub-url`` or ``$JUPYTERHUB_URL`` (default
http://127.0.0.1:8000), the token from ``--token-file`` or ``$JUPYTERHUB_API_TOKEN``;
the token needs the ``admin:servers`` scope. Errors are one line on stderr and
exit status 1 (usage errors: 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

PROG = "gpuspawner"
DEFAULT_HUB_URL = "http://127.0.0.1:8000"


class CLIError(Exception):
    """What went wrong, in one line for the admin."""


def api(hub_url: str, token: str, method: str, path: str, timeout: float = 30, body: dict | None = None) -> Any:
    url = hub_url.rstrip("/") + "/hub/api/" + path.lstrip("/")
    headers = {"Authorization": f"token {token}"}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(url, method=method, headers=headers, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        try:
            message = json.load(exc).get("message") or exc.reason
        except (ValueError, AttributeError):
            message = exc.reason
        hint = " (does the token have the admin:servers scope?)" if exc.code == 403 else ""
        raise CLIError(f"{url}: HTTP {exc.code}: {message}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CLIError(f"cannot reach the hub at {hub_url}: {reason}") from None
    except ValueError:
        raise CLIError(f"{url}: the answer is not JSON (is this a JupyterHub?)") from None


def format_alloc_map(alloc_map: dict) -> str:
    """The map as a table, one line per device, by host."""
    rows = [("HOST", "#", "DEVICE", "MODEL", "ALLOCATED", "HEALTH", "HOLDERS")]
    for host, devices in sorted(alloc_map.items()):
        for uuid, d in devices.items():
            holders = ", ".join(_holder(h) for h in d["holders"])
            health = d["health"] if d["health"] == "ok" else f"{d['health']}: {'; '.join(d['problems'])}"
            rows.append(
                (host, str(d.get("index", "")), uuid, d["model"], f"{d['allocated']:.2f}", health, holders or "-")
            )
    if len(rows) == 1:
        return "No GPUs are known to the hub."
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def _holder(h: dict) -> str:
    """``alice/big (0.50)``, and its memory against its share's once a report has told it."""
    text = f"{h['user']}{'/' + h['server'] if h['server'] else ''} ({h['share']:.2f})"
    if h.get("used_mib") is not None:
        text += f" {_gib(h['used_mib'])}/{_gib(h['entitled_mib'])} GiB" + (" OVER" if h.get("memory_over") else "")
    return text


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def format_usage(result: dict) -> str:
    # With fair share, a user's recent use (decayed GPU-hours) as the line orders by it.
    recent = any("recent_gpu_hours" in u for u in result["usage"])
    rows = [(result["by"].upper(), "GPU-HOURS", "RECENT" if recent else "", "PEAK GPU MEMORY")]
    rows += [
        (
            u["key"] or "(still held)",
            f"{u['gpu_hours']:.2f}",
            f"{u['recent_gpu_hours']:.2f}" if recent else "",
            "-" if u.get("peak_memory_mib") is None else f"{_gib(u['peak_memory_mib'])} GiB",
        )
        for u in result["usage"]
    ]
    span = f"from {result['since'] or 'the start'} to {result['until'] or 'now'}"
    if len(rows) == 1:
        return f"No GPU use {span}."
    width = max(len(r[0]) for r in rows)
    lines = [f"{a.ljust(width)}  {b.rjust(9)}  " + (f"{c.rjust(7)}  " if recent else "") + d for a, b, c, d in rows]
    return "\n".join([f"GPU use {span}:"] + lines)


def format_findings(findings: list[dict]) -> str:
    if not findings:
        return "No known misconfiguration found."
    lines = []
    for f in findings:
        where = f" {f['host']}" if f["host"] else ""
        lines += [f"{f['severity'].upper()}{where}: {f['problem']}", f"  fix: {f['fix']}"]
    return "\n".join(lines)


def format_line(result: dict) -> str:
    """Each model's line in order; or what --remove took out."""
    if result.get("removed"):
        server = f" ({result['server']})" if result["server"] else ""
        return f"Took {result['user']}{server} out of the line for {result['model']}."
    rows = [("MODEL", "#", "USER", "SERVER", "WAITING SINCE")]
    for model, waiters in sorted(result.items()):
        rows += [(model, str(w["position"]), w["user"], w["server"] or "-", w["since"]) for w in waiters]
    if len(rows) == 1:
        return "Nobody waits in line."
    return _table(rows)


def format_quotas(result: dict) -> str:
    """Per group and model: the quota and how it stands; then what cannot be met now."""
    if not result["quotas"]:
        return "No quotas (gpu_quotas is empty)."
    rows = [("GROUP", "MODEL", "QUOTA", "WITHIN", "BORROWS", "IDLE", "WAITING", "TAKEN BACK FOR IT")]
    for q in result["quotas"]:
        taking = ", ".join(f"{t['server']} at {t['stop_at']}" for t in q["taking_back"]) or "-"
        rows.append((q["group"], q["model"], q["quota"], q["within"], q["borrowed"], q["idle"], q["waiting"], taking))
    problems = [f"WARNING: {p['problem']}\n  fix: {p['fix']}" for p in result["problems"]]
    return "\n".join([_table(rows), *problems])


def format_reservations(result: dict, removed: bool = False) -> str:
    """Each reservation with its open or next window and what its members hold; or the one made or removed."""
    if "reservations" not in result:
        shares = " in shares" if result.get("shares") else ""
        what = f"{result['name']}, {result['count']} {result['model']}{shares} for {result['group']}."
        return f"{'Removed reservation' if removed else 'Reservation'} {result['id']}: {what}"
    rows = [("ID", "NAME", "GROUP", "MODEL", "COUNT", "WEEKLY", "LENDS", "WINDOW (UTC)", "OPEN", "MEMBERS HOLD")]
    for r in result["reservations"]:
        w = r["window"]
        window = f"{w['start']} – {w['end']}" if w else "over"
        rows.append(
            (
                str(r["id"]),
                r["name"],
                r["group"],
                r["model"],
                _count(r),
                (f"yes ({r['timezone']}" + (f", until {r['until']})" if r.get("until") else ")"))
                if r["weekly"]
                else "no",
                "yes" if r.get("lend") else "no",
                window,
                "yes" if r["open"] else "no",
                f"{r['members_hold']:g}",
            )
        )
    return _table(rows) if len(rows) > 1 else "No reservations."


def _count(r: dict) -> str:
    return f"{r['count']} (shares)" if r.get("shares") else str(r["count"])


def _number(text: str) -> int | float:
    """A reservation's count: whole, or a share total such as 2.5 (checked by the hub)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _table(rows: list[tuple[str, ...]]) -> str:
    """Rows as columns padded to their widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min {int(seconds % 60):02d} s"


def format_idle(result: dict) -> str:
    """Who is idle now, longest first; then the processes no holder owns."""
    rows = [("USER", "SERVER", "HOST", "IDLE FOR", "LAST GPU ACTIVITY", "WARNED")]
    for r in result["idle"]:
        since = r["last_gpu_activity"] or "never seen"
        rows.append(
            (
                r["user"],
                r["server"] or "-",
                r["host"],
                _duration(r["idle_seconds"]),
                since,
                "yes" if r["warned"] else "no",
            )
        )
    lines = ["Nobody holding GPUs is idle now."] if len(rows) == 1 else []
    if len(rows) > 1:
        lines = _table(rows).splitlines()
    for host, procs in sorted(result.get("unattributed", {}).items()):
        for p in procs:
            owner = f"service {p['service']}, which does not hold it" if p["service"] else "no container traced"
            lines.append(f"unattributed: {host} {p['uuid']} pid {p['pid']} ({p['used_mib']} MiB): {owner}")
    return "\n".join(lines)


def _token(args) -> str:
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise CLIError(f"cannot read the token file {args.token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "").strip()
    if not token:
        raise CLIError("no API token: pass --token-file FILE or set JUPYTERHUB_API_TOKEN")
    return token


def format_agent_tokens(result: dict) -> str:
    if "hosts" in result:
        rows = [f"{t['host']}  issued {t['issued_at']}" for t in result["hosts"]]
        return "\n".join(rows) if rows else "No node has an agent token."
    if result.get("revoked"):
        return f"Revoked the agent token of {result['host']}: its agent's reports now get 403."
    return result["token"]  # alone on stdout, to go straight into the node's token file


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Admin commands for gpuspawner on a running hub.")
    parser.add_argument(
        "--hub-url",
        default=os.environ.get("JUPYTERHUB_URL", DEFAULT_HUB_URL),
        help="the hub's public URL (default: $JUPYTERHUB_URL or %(default)s)",
    )
    parser.add_argument("--token-file", help="file with an API token (default: $JUPYTERHUB_API_TOKEN)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("alloc-map", "who holds which share of which GPU"),
        ("rescan", "reconcile with the swarm's services, then show the map"),
        ("doctor", "check the cluster for known misconfigurations"),
        ("idle", "who holds GPUs and is idle now"),
        ("quotas", "each group's quota: held within it, borrowed, idle, and what is taken back for it"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = sub.add_parser("usage", help="GPU-hours per user or per model")
    p.add_argument("--since", default="", help="ISO 8601 time, e.g. 2026-11-01 (default: the first allocation)")
    p.add_argument("--until", default="", help="ISO 8601 time (default: now)")
    p.add_argument(
        "--by",
        choices=("user", "model", "reason", "quota"),
        default="user",
        help="reason: why allocations ended; quota: within a group's quota or borrowed",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = sub.add_parser("line", help="who waits in line for which model; --remove takes a request out")
    p.add_argument("--remove", metavar="USER[/SERVER]", help="the request to take out of the line")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = sub.add_parser("agent-token", help="issue, rotate, revoke or list node agents' tokens")
    p.add_argument("host", nargs="?", help="the node's hostname, as `docker node ls` shows it")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--revoke", action="store_true", help="revoke HOST's token")
    what.add_argument("--list", action="store_true", help="list the hosts that have a token")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("reserve", help="reserve GPUs of a model for a group's window; --list, --remove ID")
    p.add_argument("group", nargs="?", help="the JupyterHub group whose members the GPUs are kept for")
    p.add_argument("model", nargs="?", help="the GPU model, as the form names it")
    p.add_argument("count", nargs="?", type=_number, help="how many whole GPUs (with --shares: a total, e.g. 2.5)")
    p.add_argument("--start", help="ISO 8601, e.g. 2026-12-08T14:00 (in --timezone unless it has an offset)")
    p.add_argument("--end", help="ISO 8601, the window's end")
    p.add_argument("--weekly", action="store_true", help="the same window every week, at the same local time")
    p.add_argument("--lend", action="store_true", help="unused GPUs go to others until a member waits for one")
    p.add_argument("--shares", action="store_true", help="COUNT is a total that members take as shares or whole GPUs")
    p.add_argument("--until", help="with --weekly: no window starts at or after this time (ISO 8601)")
    p.add_argument("--timezone", default="UTC", help="IANA name, e.g. Europe/Berlin (default: %(default)s)")
    p.add_argument("--name", default="", help="shown to people (default: the group's name)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the reservations and what their members hold")
    what.add_argument("--remove", metavar="ID", type=int, help="remove reservation ID")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _reserve_request(parser: argparse.ArgumentParser, args) -> tuple[str, str, dict | None]:
    made = (args.group, args.model, args.count, args.start, args.end)
    if args.list or args.remove is not None:
        if any(v is not None for v in made) or args.weekly or args.lend or args.shares or args.name or args.until:
            parser.error("reserve --list and --remove take nothing else")
        if args.list:
            return "GET", "gpuspawner/reservations", None
        return "DELETE", f"gpuspawner/reservations/{args.remove}", None
    if any(v is None for v in made):
        parser.error("reserve needs GROUP MODEL COUNT --start TIME --end TIME (or --list, --remove ID)")
    keys = ("group", "model", "count", "start", "end", "weekly", "timezone", "name", "lend", "shares")
    body = {k: getattr(args, k) for k in keys} | ({"until": args.until} if args.until else {})
    return "POST", "gpuspawner/reservations", body


def _request(parser: argparse.ArgumentParser, args) -> tuple[str, str]:
    """The command's HTTP method and path under /hub/api/."""
    if args.command == "usage":
        query = urllib.parse.urlencode({"since": args.since, "until": args.until, "by": args.by})
        return "GET", f"gpuspawner/usage?{query}"
    if args.command == "line":
        if args.remove is None:
            return "GET", "gpuspawner/queue"
        user, _, server = args.remove.partition("/")
        if not user:
            parser.error("line --remove needs USER or USER/SERVER")
        return "DELETE", "gpuspawner/queue/" + "/".join(urllib.parse.quote(p, safe="") for p in (user, server) if p)
    if args.command == "agent-token":
        if args.list:
            if args.host:
                parser.error("agent-token --list takes no HOST")
            return "GET", "gpuspawner/agent-tokens"
        if not args.host:
            parser.error("agent-token needs a HOST (or --list)")
        return ("DELETE" if args.revoke else "POST"), "gpuspawner/agent-tokens/" + urllib.parse.quote(
            args.host, safe=""
        )
    return ("POST" if args.command == "rescan" else "GET"), f"gpuspawner/{args.command}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    body = None
    if args.command == "reserve":
        method, path, body = _reserve_request(parser, args)
    else:
        method, path = _request(parser, args)
    try:
        result = api(args.hub_url, _token(args), method, path, body=body)
    except CLIError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    formats = {
        "usage": format_usage,
        "doctor": lambda r: format_findings(r["findings"]),
        "agent-token": format_agent_tokens,
        "idle": format_idle,
        "line": format_line,
        "quotas": format_quotas,
        "reserve": lambda r: format_reservations(r, removed=args.remove is not None),
    }
    print(json.dumps(result, indent=2) if args.json else formats.get(args.command, format_alloc_map)(result))
    if args.command == "agent-token" and "token" in result and not args.json:
        done = "Rotated: the old token stops working now" if result["rotated"] else "Issued"
        where = f"; {args.host} is not a swarm node yet" if result.get("node") is False else ""
        print(f"{done}; install it on {args.host} (docs/agent.md){where}.", file=sys.stderr)
    if args.command == "doctor" and any(f["severity"] == "error" for f in result["findings"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
