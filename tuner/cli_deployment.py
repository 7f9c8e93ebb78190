"""The subcommands around a running deployment: `tuner check` (an endpoint against its
exported evidence) and `tuner compare` (two endpoints, interleaved), with their options.

The measuring is tuner.deployment's; this module is their argparse side, wired into the
`tuner` command by :func:`tuner.cli.build_parser`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.composition import compose
from tuner.console import say


def _client_cpus(text: str | None) -> tuple[int, ...] | None:
    from tuner.host.placement import parse_cpus

    return parse_cpus(text, "--client-cpus") if text else None


def cmd_check(args: argparse.Namespace) -> int:
    """Measure a running deployment with its evidence's workload: 0 pass, 1 regression,
    3 unresolved (no regression seen, but some objective could not resolve check.resolve)."""
    from tuner.deployment.check import CheckOptions, check_command

    options = CheckOptions(
        args.url,
        args.evidence,
        args.api_key_env,
        args.windows,
        args.out,
        args.wait_s,
        args.tokenizer,
        _client_cpus(args.client_cpus),
        args.max_windows,
        args.resolve,
    )
    return check_command(options, say=say)


def cmd_compare(args: argparse.Namespace) -> int:
    """Two running endpoints under one workload, interleaved: B better, worse or the same."""
    from tuner.deployment.compare import CompareOptions, compare_command

    options = CompareOptions(
        args.url_a,
        args.url_b,
        args.api_key_env,
        args.api_key_env_b,
        args.windows,
        args.out,
        args.wait_s,
        _client_cpus(args.client_cpus),
        args.max_windows,
    )
    return compare_command(compose(args.overrides, args.config_dir), options, say=say)


def _add_endpoint_options(p: argparse.ArgumentParser, windows: int, out: str) -> None:
    p.add_argument("--api-key-env", default=None, help="the variable holding the API key")
    p.add_argument("--windows", type=int, default=windows, help=f"default: {windows}")
    p.add_argument("--max-windows", type=int, default=12, help="to resolve check.resolve")
    p.add_argument("--out", type=Path, default=Path(out), help=f"reports; default: {out}")
    p.add_argument("--wait-s", type=float, default=30.0, help="for the endpoint to answer")
    p.add_argument("--client-cpus", default=None, help="pin the load generator, e.g. 1")


def add_deployment(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser("check", help="is a running deployment as good as its evidence")
    check.add_argument("--url", required=True, help="the deployment, e.g. http://host:8000")
    check.add_argument("--evidence", type=Path, required=True, help="export/evidence.json")
    check.add_argument("--tokenizer", type=Path, default=None, help="local copy of the model")
    check.add_argument("--resolve", type=float, default=None, help="instead of check.resolve")
    _add_endpoint_options(check, 3, "tuner-check")
    check.set_defaults(func=cmd_check)
    compare = sub.add_parser("compare", help="two running endpoints, interleaved: B vs A")
    compare.add_argument("overrides", nargs="*", help="Hydra overrides: workload, slo, model")
    compare.add_argument("--url-a", required=True, help="the endpoint to compare with")
    compare.add_argument("--url-b", required=True, help="the endpoint under test")
    compare.add_argument("--api-key-env-b", default=None, help="B's key, if not --api-key-env")
    compare.add_argument("--config-dir", type=Path, default=None, help="instead of conf/")
    _add_endpoint_options(compare, 4, "tuner-compare")
    compare.set_defaults(func=cmd_compare)
