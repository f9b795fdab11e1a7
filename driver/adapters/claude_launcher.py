#!/bin/sh
''''eval "exec ${AGENT_DRIVER_CLAUDE_LAUNCH:?is not set: this file is started by agent-driver only}" # '''  # fmt: skip

# The program the Claude Agent SDK starts instead of the Claude Code CLI (`cli_path`): a FIXED file of
# the installed package, never written at run time, so nothing the agent can write is ever executed
# in its place (it used to be generated into the agent-writable state_dir before each start).
#
# It is a shell script (line 1) that Python also reads as a module holding one string (line 2; `fmt:
# skip`: a formatter's quotes would break the shell's reading), so it
# ships with the package like any module, executable bit included. Line 2 is all it does: run the
# command the driver put in AGENT_DRIVER_CLAUDE_LAUNCH (`claude_options.launch_command`: names and
# paths only, never a value), which is `env -u NAME ... setsid <containment> <cli> "$@"`:
#
# - `env -u` drops every variable of the driver's environment that the provider's does not list, and
#   the launch variable itself: the CLI and everything it starts get only the provider's environment
#   (the SDK passes the CLI the driver's whole environment, and the one shell reading these lines
#   execs at once and runs nothing else);
# - `setsid` gives the CLI its own process group (it execs without forking: the SDK's child is not a
#   group leader), which the kernel can kill on escalation without killing itself;
# - the containment prefix (driver/containment.py) ties the CLI's tree to the driver and hides the
#   driver's state from it, like every provider.
