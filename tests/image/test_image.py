"""The image smoke test: one turn per runtime, run the way the Dockerfile runs the driver.

Without Docker (every machine): the wheel, built from what the Dockerfile copies, is installed into a
fresh venv made from Debian's /usr/bin/python3 under a read-only folder that plays /opt/agent-driver
(its node_modules are the pinned runtimes `make setup` installed, on the pinned Node: as root, bound
onto it in the driver's own mount namespace, so a checkout under a 0700 folder works too); the driver
starts as uid 10001 with `env -i` plus only the Dockerfile's ENV (and HOME, as `docker run` sets it),
in a writable folder that plays /workspace, reads a boot payload minted by `agent-driver controlplane
boot` (the lab, from the test's environment: the image does not carry it), and answers one turn
through the reference control plane, with only the model endpoint faked.
With a reachable Docker daemon, `test_the_docker_image` builds the Dockerfile and does the same with
`docker run`; without one it is skipped and says why.

The slow part is built once per module: the wheel (~3 s) and the venv (8-13 s with pip's cache warm;
dependencies resolve from the cache, the wheel itself is built `--no-deps`). Measured on 2 shared
cores: the whole module 25 s on a quiet machine, 58 s on a loaded one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_lab.testing import codex_acp

from tests.image.sandbox import (
    ROOT,
    ControlPlaneProcess,
    build_wheel,
    chown_tree,
    control_plane,
    dockerfile_env,
    dockerfile_labels,
    make_venv,
    operator_command,
    owned_dir,
    private_mount,
    relocate,
    run,
    runtimes_in,
    sandbox_user,
)

pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

# `acp` with codex-acp, as asked of every runtime; `acp:claude-agent-acp` too, the runtime whose
# `engines` (node >= 22) made the image pin its own Node.
RUNTIMES = ("claude-agent-sdk", "openai-app-server", "acp", "acp:claude-agent-acp")
TURN_TIMEOUT_S = 120
DOCKER_IMAGE = "agent-driver:image-test"


@dataclass
class Image:
    base: Path  # everything this module made (deleted at the end)
    root: Path  # plays /opt/agent-driver: venv/ and node_modules/, read-only
    owner: tuple[int, int]  # the driver's uid and gid

    @property
    def cli(self) -> str:
        return str(self.root / "venv" / "bin" / "agent-driver")


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    # Not pytest's tmp_path: that is private to the test runner's uid, and uid 10001 must reach it.
    base = Path(tempfile.mkdtemp(prefix="agent-driver-image-"))
    base.chmod(0o755)
    root = base / "opt-agent-driver"
    root.mkdir()
    try:
        started = time.monotonic()
        wheel = build_wheel(base / "build")
        built = time.monotonic()
        make_venv(root / "venv", wheel)
        print(f"\nimage: wheel built in {built - started:.1f} s, venv installed in {time.monotonic() - built:.1f} s")
        runtimes_in(root)
        root.chmod(0o555)  # the project folder is read-only to the driver
        yield Image(base, root, sandbox_user())
    finally:
        root.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# -- one turn, wherever the driver runs --------------------------------------------------------------


@dataclass
class Sandbox:
    """One driver's folders: `host` paths are where this test sees them, `seen` where the driver does."""

    workspace: Path
    boot_dir: Path
    workspace_seen: str
    boot_dir_seen: str

    def seen(self, path: Path) -> str:
        return (
            self.workspace_seen + "/" + str(path.relative_to(self.workspace))
            if path != self.workspace
            else self.workspace_seen
        )


Launch = Callable[[Sandbox, Path], subprocess.Popen[bytes]]


def new_sandbox(image: Image, name: str, workspace_seen: str | None = None, boot_seen: str | None = None) -> Sandbox:
    folder = image.base / f"{name}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(mode=0o755)
    workspace = owned_dir(folder / "workspace", image.owner)
    boot_dir = owned_dir(folder / "run", image.owner)
    return Sandbox(workspace, boot_dir, workspace_seen or str(workspace), boot_seen or str(boot_dir))


@contextlib.contextmanager
def model_endpoint(runtime: str) -> Iterator[Any]:
    if "claude" in runtime:
        from agent_lab.testing.fake_anthropic import FakeAnthropic

        with FakeAnthropic() as fake:
            yield fake
    else:
        from agent_lab.testing.fake_responses import FakeResponses

        with FakeResponses() as fake:
            yield fake


def runtime_flags(runtime: str, box: Sandbox, fake: Any, owner: tuple[int, int]) -> tuple[list[str], dict[str, str]]:
    """`controlplane boot` flags for the runtime, and the environment they take values from."""
    if runtime == "claude-agent-sdk":
        env = {"ANTHROPIC_API_KEY": "sk-ant-image-test-key", "ANTHROPIC_BASE_URL": fake.base_url}
        return ["--model", "claude-sonnet-4-5", "--env", "ANTHROPIC_API_KEY", "--env", "ANTHROPIC_BASE_URL"], env
    if runtime == "acp:claude-agent-acp":
        # Named bare: found in node_modules/.bin, a `#!/usr/bin/env node` script run by the pinned Node.
        config = box.workspace / ".claude"
        owned_dir(config, owner)
        flags = ["--env", "ANTHROPIC_API_KEY", "--acp-command", "claude-agent-acp",
                 "--acp-env", f"ANTHROPIC_BASE_URL={fake.base_url}",
                 "--acp-env", f"CLAUDE_CONFIG_DIR={box.seen(config)}",
                 "--acp-env", "CLAUDE_CODE_MAX_RETRIES=0",
                 "--acp-env", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"]  # fmt: skip
        return flags, {"ANTHROPIC_API_KEY": "sk-ant-image-test-key"}
    env = {"OPENAI_API_KEY": "sk-image-test-key"}
    if runtime == "openai-app-server":
        flags = ["--env", "OPENAI_API_KEY", "--provider-option", "env_key=OPENAI_API_KEY",
                 "--provider-option", f"base_url={fake.base_url}"]  # fmt: skip
        return flags, env
    # acp with codex-acp, named bare: the driver finds it in node_modules/.bin, a Node script run by the
    # pinned Node. codex-acp reads its own CODEX_HOME (as `make run` sets it up).
    home = codex_acp.write_home(box.workspace / ".codex", fake.base_url)
    tmp = box.workspace / ".tmp"  # codex-acp will not install its sandbox helper under /tmp
    tmp.mkdir()
    chown_tree(home, owner)
    chown_tree(tmp, owner)
    flags = ["--env", "OPENAI_API_KEY", "--acp-command", "codex-acp",
             "--acp-env", f"CODEX_HOME={box.seen(home)}", "--acp-env", f"TMPDIR={box.seen(tmp)}"]  # fmt: skip
    return flags, env


def client(cp: ControlPlaneProcess, command: str, instance: str, *args: str) -> dict[str, Any]:
    operator, env = operator_command()
    done = run([*operator, "controlplane", command, "--url", cp.api, "--token-file", cp.token_file,
                "--instance", instance, *args], env=env)  # fmt: skip
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def one_turn(image: Image, runtime: str, box: Sandbox, launch: Launch) -> None:
    instance = f"drv-image-{runtime.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    boot_file = box.boot_dir / "boot.json"
    log_path = box.workspace.parent / "driver.log"
    said = f"image smoke test on {runtime}"
    operator, operator_env = operator_command()
    with model_endpoint(runtime) as fake, control_plane(box.workspace.parent) as cp:
        flags, env = runtime_flags(runtime, box, fake, image.owner)
        run([*operator, "controlplane", "boot", "--runtime", runtime.split(":")[0], "--instance", instance,
             "--out", boot_file, "--url", cp.api, "--token-file", cp.token_file,
             "--cwd", box.workspace_seen, "--state-dir", box.seen(box.workspace / ".agent-driver"),
             "--owner", f"{image.owner[0]}:{image.owner[1]}", *flags],
            env={**operator_env, **env})  # fmt: skip
        driver = launch(box, log_path)
        try:
            client(cp, "send", instance, "--kind", "input.start", "--run-id", "run-1",
                   "--text", f"[[say:{said}]]")  # fmt: skip
            ended = client(cp, "events", instance, "--kind", "run.completed", "--kind", "run.failed",
                           "--kind", "run.cancelled", "--wait", str(TURN_TIMEOUT_S))  # fmt: skip
            kinds = [e["kind"] for e in ended["events"]]
            assert kinds == ["run.completed"], f"{kinds}: {ended}\n{log_path.read_text(errors='replace')[-4000:]}"
            messages = client(cp, "events", instance, "--kind", "message.completed")["events"]
            assert said in " ".join(m["payload"].get("text", "") for m in messages)
            client(cp, "send", instance, "--kind", "session.stop")
            assert driver.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        token = cp.token_file.read_text().strip()
    assert not boot_file.exists(), "the driver must delete its boot payload"
    assert (box.workspace / ".agent-driver").stat().st_uid == image.owner[0], "the driver ran as the sandbox uid"
    # The control token reaches no log line and no file the driver or its provider wrote.
    assert token not in log_path.read_text(errors="replace")
    for folder, _dirs, files in os.walk(box.workspace):
        for name in files:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                assert token.encode() not in path.read_bytes(), f"the control token leaked into {path}"


# -- without Docker ----------------------------------------------------------------------------------


def launch_here(image: Image) -> Launch:
    env = relocate(dockerfile_env(), image.root)
    env["HOME"] = str(image.base / "home")  # docker run sets HOME from the image user's passwd entry
    owned_dir(image.base / "home", image.owner)
    entrypoint = shutil.which("agent-driver", path=env["PATH"])
    assert entrypoint == image.cli, "the Dockerfile's PATH must find the venv's agent-driver first"

    # As root: the driver in its own mount namespace with the runtimes bound in, then as the sandbox uid.
    prefix = private_mount(image.root / "node_modules", image.owner) if os.geteuid() == 0 else []

    def launch(box: Sandbox, log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(
                [*prefix, entrypoint, "run", "--boot-file", str(box.boot_dir / "boot.json")],
                env=env,  # `env -i` plus the Dockerfile's ENV: nothing of this test's environment
                cwd=box.workspace, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    return launch


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_turn_as_the_image_runs_it(image: Image, runtime: str) -> None:
    if os.geteuid() == 0:
        probe = subprocess.run(["/usr/bin/test", "-w", str(image.root)], user=image.owner[0], group=image.owner[1])
        assert probe.returncode != 0, "the project folder must be read-only to the driver"
    one_turn(image, runtime, new_sandbox(image, runtime.replace(":", "-")), launch_here(image))


# -- with Docker, when a daemon is reachable ----------------------------------------------------------


def docker_unavailable() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on PATH"
    probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"no Docker daemon reachable ({reason})"
    return None


def test_the_docker_image(image: Image) -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(f"docker build/run part skipped: {reason}; the same turns ran without Docker above")
    run(["docker", "build", "--quiet", "--tag", DOCKER_IMAGE, ROOT], timeout=1800)
    inspected = run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", DOCKER_IMAGE])
    labels = json.loads(inspected.stdout) or {}
    assert {k: labels.get(k) for k in dockerfile_labels()} == dockerfile_labels()

    def launch(box: Sandbox, log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(
                ["docker", "run", "--rm", "--network", "host", "--user", f"{image.owner[0]}:{image.owner[1]}",
                 "--volume", f"{box.workspace}:/workspace", "--volume", f"{box.boot_dir}:/run/agent-driver",
                 DOCKER_IMAGE, "--boot-file", "/run/agent-driver/boot.json"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    for runtime in RUNTIMES:
        box = new_sandbox(image, f"docker-{runtime.replace(':', '-')}", "/workspace", "/run/agent-driver")
        one_turn(image, runtime, box, launch)  # the control plane's ws://127.0.0.1 URL: the host network
