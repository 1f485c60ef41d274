"""The ``kneepoint`` command line.

Subcommands live in their own modules and are imported only when invoked, so that
``kneepoint sim`` in a pod does not import kopf or the Kubernetes client, and a missing
optional dependency of one command never breaks the others.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# name -> "module:attribute" of a click.Command. Keep sorted by name.
_COMMANDS: dict[str, tuple[str, str]] = {
    "decide": ("kneepoint.commands.decide", "Print the record table and the decision for measured tiers."),
    "demo": ("kneepoint.commands.demo", "Run an example experiment end to end on the local sandbox."),
    "estimate": ("kneepoint.commands.estimate", "Estimate per-GPU memory for every tier before spending GPU time."),
    "export": ("kneepoint.commands.export", "Print the KServe InferenceService for an experiment's decision."),
    "loadgen": ("kneepoint.loadgen.command", "Load-test an OpenAI-compatible server at fixed concurrency."),
    "operator": ("kneepoint.commands.operator", "Run the operator (kopf) against the current kube context."),
    "probe": ("kneepoint.nodeprobe.command", "Read NVML topology and label this node with its NVLink domains."),
    "report": ("kneepoint.commands.report", "Report an experiment: tables, comparison blocks and a PNG chart."),
    "sandbox": ("kneepoint.sandbox.command", "Run a local Kubernetes control plane with simulated GPU nodes."),
    "sim": ("kneepoint.simulator.command", "Serve a vLLM-compatible engine simulator (no GPU needed)."),
    "trace": ("kneepoint.commands.trace", "Collective share and rank skew from an engine's torch-profiler traces."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in _COMMANDS.items() if importlib.util.find_spec(module) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, _ = entry
        if importlib.util.find_spec(module_name) is None:
            return None
        module = importlib.import_module(module_name)
        command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above so that `kneepoint --help` imports nothing heavy.
        rows = [(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kneepoint")
def cli() -> None:
    """kneepoint: find the knee of the GPU scaling curve for LLM inference, with measurements."""


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="kneepoint")


if __name__ == "__main__":
    main()
