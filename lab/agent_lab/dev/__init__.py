"""`agent-driver dev`: the driver with an embedded reference control plane and a terminal chat.

It is the product as a sandbox runs it, on one machine: the reference control plane runs in this
process (its SQLite store under the work dir), a one-time boot file is written, and `agent-driver run`
starts as a separate process that dials the control plane, exactly as in a sandbox. The chat talks to
the driver only through control-plane commands and reads only what the control plane stored, so what
you see is what a real control plane would see. Without a provider API key the model is the offline
fake from `lab/agent_lab/testing/`, and the first line of output says so.

The work dir (default ./.dev):
    controlplane.sqlite3        every stored event and command of every dev session
    workspace/                  the agent's working directory (shared by dev sessions)
    memory/                     the pet session's memory_dir
    sessions/<instance>/        the driver's state_dir, driver.log (its stderr), controlplane.log

The parts: `common` (constants, paths), `provider` (real API or offline fake), `launch` (boot payload,
driver subprocess), `view` (what the terminal shows, no I/O), `chat` (the loop over typed lines,
signals and stored events, and the commands it sends), `pump` (what the control plane stores, shown and
turned into actions), `typed` (what a typed line means), `asking` (the permission prompts, one at a
time), `follow` (the runs the chat follows), `terminal` (stdin and signals as actions), `session` (the
whole run).
"""

from agent_lab.dev.chat import DevChat
from agent_lab.dev.common import (
    AGENT_PREFIX,
    CONSOLE_PREFIX,
    THINKING_PREFIX,
    USER_PROMPT,
    Action,
    DevError,
    DevPaths,
)
from agent_lab.dev.launch import boot_payload, driver_environment, launch_driver, write_boot_file
from agent_lab.dev.provider import ProviderSetup, prepare_provider
from agent_lab.dev.session import DevOptions, main, run_dev
from agent_lab.dev.view import Status, Transcript, choose_option

__all__ = [
    "AGENT_PREFIX",
    "CONSOLE_PREFIX",
    "THINKING_PREFIX",
    "USER_PROMPT",
    "Action",
    "DevChat",
    "DevError",
    "DevOptions",
    "DevPaths",
    "ProviderSetup",
    "Status",
    "Transcript",
    "boot_payload",
    "choose_option",
    "driver_environment",
    "launch_driver",
    "main",
    "prepare_provider",
    "run_dev",
    "write_boot_file",
]
