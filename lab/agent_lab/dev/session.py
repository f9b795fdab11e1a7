"""One local dev session: the embedded control plane, the driver it boots, and the chat between them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from agent_lab.dev.chat import DevChat
from agent_lab.dev.common import HEARTBEAT_MS, HELP, Action, DevError, DevPaths, new_instance_id
from agent_lab.dev.launch import boot_payload, end_process, launch_driver, write_boot_file
from agent_lab.dev.provider import prepare_provider
from agent_lab.dev.terminal import signals_to_actions, start_stdin_reader, wants_color


@dataclass(frozen=True)
class DevOptions:
    runtime: str
    workdir: Path
    once: str | None


async def run_dev(options: DevOptions, out: TextIO, env: Mapping[str, str]) -> int:
    # Signals become actions from the very start, so Ctrl-C while starting up stops cleanly too.
    actions: asyncio.Queue[Action] = asyncio.Queue()
    with signals_to_actions(asyncio.get_running_loop(), actions.put_nowait):
        return await _run_dev(options, out, env, actions)


async def _run_dev(options: DevOptions, out: TextIO, env: Mapping[str, str], actions: asyncio.Queue[Action]) -> int:
    from agent_lab.controlplane.cli import console_login_url
    from agent_lab.controlplane.console import ConsoleConfig
    from agent_lab.controlplane.server import ControlPlane
    from driver import logs

    paths = DevPaths(options.workdir.resolve(), new_instance_id())
    paths.create()
    with contextlib.ExitStack() as stack:
        provider = prepare_provider(options.runtime, paths, env, stack)
        out.write(provider.notice + "\n")
        # The in-process control plane logs to a file: the terminal is for the chat.
        logs.configure("info", stream=stack.enter_context(paths.cp_log.open("a")))
        token = secrets.token_urlsafe(32)
        console = ConsoleConfig(token=secrets.token_urlsafe(24), artifact_roots={paths.instance_id: paths.workspace})
        cp = ControlPlane(
            paths.db,
            tokens={token: {paths.instance_id}},
            http_port=0,
            heartbeat_interval_ms=HEARTBEAT_MS,
            console=console,
        )
        async with cp:
            _banner(out, options, paths, cp.url, console_login_url(cp, True))
            if not actions.empty():  # only a signal can be queued yet: nothing to stop
                out.write("[dev] interrupted before the driver started\n")
                return 130
            with cp.subscribe(paths.instance_id) as sub:
                write_boot_file(paths.boot_file, boot_payload(paths, cp.url, token, options.runtime, provider))
                driver = await launch_driver(paths, env)
                try:
                    chat = DevChat(
                        cp,
                        paths,
                        driver,
                        out,
                        actions,
                        once=options.once,
                        prompts=options.once is None and sys.stdin.isatty(),
                        color=wants_color(out),
                    )
                    if options.once is None:
                        start_stdin_reader(asyncio.get_running_loop(), chat.push)
                    return await chat.serve(sub)
                finally:
                    await end_process(driver)
                    # The driver deletes the boot file as it reads it; if it never did, the token must go.
                    paths.boot_file.unlink(missing_ok=True)
    return 1  # not reached: the chat returns from inside the control plane's block


def _banner(out: TextIO, options: DevOptions, paths: DevPaths, url: str, console_url: str) -> None:
    out.write(
        f"agent-driver dev: runtime {options.runtime}{' (agent: codex-acp)' if options.runtime == 'acp' else ''}, "
        f"instance {paths.instance_id}\n"
        f"  console (web, in step with this chat): {console_url}\n"
        f"  driver log (its stderr): {paths.driver_log}\n"
        f"  control plane: {url}, events stored in {paths.db}, its log in {paths.cp_log}\n"
        f"  agent workspace: {paths.workspace}\n"
    )
    if options.once is None:
        out.write(HELP + "\n")
    out.write(f"[driver] starting {options.runtime}...\n")
    out.flush()


def main(args: argparse.Namespace) -> int:
    once: str | None = getattr(args, "once", None)
    workdir = Path(getattr(args, "workdir", None) or ".dev")
    options = DevOptions(runtime=str(args.runtime), workdir=workdir, once=once)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(errors="replace")  # a model's text must never crash the chat on a narrow terminal
    try:
        return asyncio.run(run_dev(options, out, dict(os.environ)))
    except DevError as exc:
        print(f"agent-driver dev: {exc}", file=sys.stderr)
        return 1
