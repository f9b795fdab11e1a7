"""The provider's room in the kernel: building adapters, the current native session, the transcript,
provider deaths while idle, skills, and `session.reset` (PROTOCOL §7, §8).

**The current native ref.** One ref (thread or session id) is current. It changes when the provider
opens or resumes a session (`runtime.resume.updated`), when a resume fails and a fresh session is
started (`runtime.session.reset`), and when `session.reset` discards the session. Every change is
journaled under `state_dir`. Every adapter the supervisor builds (the first one, and each replacement
after a crash, a forced cancel or the silence rule) is given the current ref to resume, never the boot
payload's older one. A new driver process resumes the boot payload's `native_resume` when it names one
(the control plane is the source of truth), else the journal's current ref.

**The transcript.** The user and assistant messages completed in this session are journaled (the
newest 64 KiB). When a resume is impossible the adapter starts fresh, reports `runtime.session.reset`
and replays the boot payload's `recovery_messages` followed by the transcript. `session.reset` empties
both: nothing from before a reset is ever replayed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from driver import logs
from driver.adapters.common.base import Adapter, AdapterConfig, ProviderError
from driver.adapters.common.environment import child_env, provider_env, withheld_of, withhold, withhold_execution
from driver.adapters.deferred import DeferredAdapter
from driver.interfaces import PathNotAllowed
from driver.kernel import provider_home
from driver.protocol.boot import NativeResume, RecoveryMessage

if TYPE_CHECKING:
    from driver.checkpoints.restore import Restored
    from driver.kernel.core import Kernel
    from driver.model_proxy.room import ProxyRoom

log = logs.get("driver.kernel.provider")

# After the provider process exits during a run, how long its adapter gets to report the crash
# itself (with its own stderr tail) before the kernel ends the run for it.
PROVIDER_EXIT_GRACE_S = 3.0
CURRENT_REF_KEY = "native_ref"
# Set once a session.reset discarded the session the boot payload's recovery messages belong to.
RECOVERY_DISCARDED_KEY = "recovery_discarded"
# §8.1: the native_ref of the execution.native_checkpoint this state_dir already tried to restore.
CHECKPOINT_RESTORED_KEY = "checkpoint_restored"


class ProviderRoom:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        journal = kernel.journal
        boot_ref = kernel.boot.execution.native_resume
        stored = _decode_ref(journal.text(CURRENT_REF_KEY))
        self.current: NativeResume | None = boot_ref or stored
        if boot_ref is not None and boot_ref != stored:
            journal.set_text(CURRENT_REF_KEY, _encode_ref(boot_ref))
        self.transcript: list[tuple[str, str]] = journal.transcript()
        self.recovery_discarded = journal.text(RECOVERY_DISCARDED_KEY) == "1"
        self.resetting = False
        # Whether the adapter being started announced its session itself (else the kernel does).
        self._announced = False
        self._replay_without_ref = False
        # §8.1: (previous ref, reason) of a checkpoint that could not be restored, said once the
        # fresh session is known.
        self._checkpoint_reset: tuple[str, str] | None = None
        # Diagnostics of the last adapter build (a home set aside), said by the supervisor.
        self.notes: list[dict[str, Any]] = []

        # PROTOCOL §6.7: the model proxy, only when the payload asks for it (imported only then).
        self.proxy: ProxyRoom | None = None
        withhold(withheld_of(kernel.boot))  # every child's environment drops these values (environment.py)
        if kernel.boot.execution.model_proxy is not None:
            from driver.model_proxy.room import ProxyRoom

            self.proxy = ProxyRoom(kernel)

    # -- building adapters ------------------------------------------------------------------------
    def replay_messages(self) -> list[RecoveryMessage]:
        """What a fresh session is given as context: boot recovery messages, then the transcript."""
        boot = [] if self.recovery_discarded else list(self.k.boot.execution.recovery_messages)
        return boot + [RecoveryMessage(role=role, text=text) for role, text in self.transcript]  # type: ignore[arg-type]

    def new_adapter(self) -> Adapter:
        k = self.k
        boot = k.boot
        # The agent's: a home that is not a folder is set aside (said as the start begins); one that
        # cannot be made raises, and the supervisor fails this start (retried with backoff).
        home, notes = provider_home.prepare(Path(boot.session.state_dir), boot.execution.runtime)
        self.notes += notes
        provider_dir = home.parent
        env = provider_env(
            boot.execution.environment,
            home=str(home),
            traceparent=boot.traceparent,
            extra=k.telemetry.provider_env(),
        )
        replay = self.replay_messages()
        execution = msgspec.structs.replace(boot.execution, native_resume=self.current, recovery_messages=replay)
        if self.proxy is not None:
            env, execution = self.proxy.adapt(env, execution, provider_dir)
        # By value, after the proxy's placeholders (PROTOCOL §6.7, §9): no withheld value under any name.
        env, execution = child_env(env), withhold_execution(execution)
        self._announced = False
        # With no ref to resume, a session that has history starts fresh with that history replayed,
        # and says so (runtime.session.reset with previous = null) once the new session is known.
        self._replay_without_ref = self.current is None and bool(replay)
        config = AdapterConfig(
            session=boot.session,
            execution=execution,
            state_dir=provider_dir,
            project_root=k.project_root,
            traceparent=boot.traceparent,
            env=env,
        )
        return DeferredAdapter(config, k.ports)

    def take_notes(self) -> list[dict[str, Any]]:
        notes, self.notes = self.notes, []
        return notes

    def on_ready(self) -> None:
        """The supervisor started an adapter: make sure its session is announced and journaled."""
        self.k.spawn(self._after_start, self.k.supervisor.adapter)
        if self.proxy is not None:
            self.k.spawn(self.proxy.provider_started)  # which placeholders a kept provider holds (§8.2)

    async def _after_start(self, adapter: Adapter) -> None:
        ref = adapter.native_id
        if ref is None and self._checkpoint_reset is not None:
            # No session came up, but the checkpoint's failure must still be said (once).
            (previous, reason), self._checkpoint_reset = self._checkpoint_reset, None
            await self.k.emit("runtime.session.reset", {"previous": previous, "current": None, "reason": reason})
        if ref is None:
            return
        runtime = self.k.boot.execution.runtime
        if self._checkpoint_reset is not None:
            (previous, reason), self._checkpoint_reset = self._checkpoint_reset, None
            self._replay_without_ref = False
            await self.k.emit("runtime.session.reset", {"previous": previous, "current": ref, "reason": reason})
        elif self._replay_without_ref:
            self._replay_without_ref = False
            await self.k.emit("runtime.session.reset", {"previous": None, "current": ref})
        if not self._announced or self.current is None or self.current.value != ref:
            await self.k.emit("runtime.resume.updated", {"runtime": runtime, "value": ref})

    # -- events that move the current ref or the transcript (called from Kernel.emit) -------------
    async def observe(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "runtime.resume.updated":
            self._announced = True
            value = payload.get("value")
            if isinstance(value, str) and value:
                await self._set_current(NativeResume(runtime=self.k.boot.execution.runtime, value=value))
        elif kind == "runtime.session.reset":
            current = payload.get("current")
            if isinstance(current, str) and current:
                await self._set_current(NativeResume(runtime=self.k.boot.execution.runtime, value=current))
        elif kind == "message.completed" and payload.get("role") == "assistant":
            text = payload.get("text")
            if isinstance(text, str) and text:
                await self._remember("assistant", text)

    async def note_user_message(self, text: str) -> None:
        if text:
            await self._remember("user", text)

    async def _remember(self, role: str, text: str) -> None:
        journal = self.k.journal
        await anyio.to_thread.run_sync(journal.transcript_append, role, text)
        self.transcript = await anyio.to_thread.run_sync(journal.transcript)

    async def _set_current(self, ref: NativeResume) -> None:
        if ref == self.current:
            return
        self.current = ref
        await anyio.to_thread.run_sync(self.k.journal.set_text, CURRENT_REF_KEY, _encode_ref(ref))
        log.info("native_session.current", runtime=ref.runtime, value=ref.value)

    # -- session.reset ----------------------------------------------------------------------------
    async def reset_session(self) -> tuple[str | None, str | None]:
        """Discard the native session and start a fresh one; a state of its own (PROTOCOL §3)."""
        k = self.k
        if k.run is not None:
            raise ProviderError("driver.run_active", "a run is active; cancel it before a reset", retryable=True)
        if self.resetting:
            raise ProviderError("driver.busy", "a session.reset is already in progress", retryable=True)
        self.resetting = True
        try:
            adapter = await k.supervisor.ready()
            # A reset may respawn the provider process: that exit is ours, not a crash.
            k.supervisor.unwatch()
            try:
                previous, current = await adapter.reset()
            finally:
                k.supervisor.rewatch()
            # Nothing from before a reset is ever replayed.
            journal = k.journal
            await anyio.to_thread.run_sync(journal.transcript_clear)
            await anyio.to_thread.run_sync(journal.set_text, RECOVERY_DISCARDED_KEY, "1")
            self.transcript = []
            self.recovery_discarded = True
            await k.emit("runtime.session.reset", {"previous": previous, "current": current})
            if current is not None:
                await k.emit("runtime.resume.updated", {"runtime": k.boot.execution.runtime, "value": current})
            elif self.current is not None:
                self.current = None
                await anyio.to_thread.run_sync(journal.set_text, CURRENT_REF_KEY, None)
            return previous, current
        finally:
            self.resetting = False

    # -- deaths and boot ---------------------------------------------------------------------------
    async def provider_exited(self, adapter: Adapter) -> None:
        """The provider process exited on its own. During a run, its adapter normally raises
        provider.crashed (with its stderr tail) and the run path replaces it; if the adapter does not
        notice within a grace period, the kernel ends the run for it. While idle: replace it."""
        k = self.k
        run = k.run
        if run is not None and run.adapter is adapter:
            if run.cancel_requested_by is None:
                with anyio.move_on_after(PROVIDER_EXIT_GRACE_S):
                    await run.ended.wait()
                if not run.ended.is_set() and run.terminal is None:
                    run.forced_error = ProviderError(
                        "provider.crashed",
                        "the provider process exited during the run",
                        retryable=True,
                        details={"stderr_tail": adapter.stderr_tail()},
                    )
                    run.scope.cancel()
            await run.ended.wait()
        else:
            await k.emit(
                "diagnostic.reported",
                {
                    "code": "provider.exited",
                    "severity": "warning",
                    "message": "the provider process exited while idle; restarting it",
                    "details": {"stderr_tail": adapter.stderr_tail()},
                },
            )
        # A no-op when the run path already replaced this adapter.
        k.supervisor.lost(adapter, "the provider exited", crashed=True)

    async def restore_checkpoint(self) -> None:
        """PROTOCOL §8.1: place `execution.native_checkpoint`'s files and make its ref current, once per
        state_dir (a restart on the same state_dir has the files already, maybe newer). On any mismatch
        no ref is current: the provider starts fresh, replays the transcript, and the reset names why."""
        k = self.k
        checkpoint = k.boot.execution.native_checkpoint
        journal = k.journal
        if checkpoint is None or journal.text(CHECKPOINT_RESTORED_KEY) is not None:
            return
        done = await _restore_files(k)
        if isinstance(done, str):
            log.warning("checkpoint.restore_failed", native_ref=checkpoint.native_ref, reason=done)
            self._checkpoint_reset = (checkpoint.native_ref, done)
            self.current = None
            await anyio.to_thread.run_sync(journal.set_text, CURRENT_REF_KEY, None)
        else:
            ref = NativeResume(runtime=checkpoint.runtime, value=checkpoint.native_ref)
            await self._set_current(ref)
            await k.emit(
                "diagnostic.reported",
                {
                    "code": "checkpoint.restored",
                    "severity": "info",
                    "message": f"native session {checkpoint.native_ref} restored from a checkpoint",
                    "details": {
                        "native_ref": checkpoint.native_ref,
                        "files": done.files,
                        "bytes": done.bytes,
                        "ms": done.ms,
                    },
                },
            )
        await anyio.to_thread.run_sync(journal.set_text, CHECKPOINT_RESTORED_KEY, checkpoint.native_ref)
        # The supervisor built its first adapter (not started yet: `boot` comes after) with the ref
        # current before the restore: build it again with the restored one.
        k.supervisor.rebuild()

    async def install_skills(self) -> None:
        k = self.k
        if not k.boot.execution.skills:
            return
        from driver.ports import skills  # zipfile and friends: only when there are skills to install

        cwd = Path(k.boot.session.cwd)
        for skill in k.boot.execution.skills:
            try:
                k.files.admit_tree(cwd / skill.mount_path)  # never over the driver's own state (§9)
                installed = await skills.install(skill, cwd, deadline_s=k.options.skill_timeout_s)
                log.info("skill.installed", name=skill.name, path=str(installed.path))
            except (skills.SkillError, PathNotAllowed) as exc:
                await k.emit(
                    "diagnostic.reported",
                    {
                        "code": "skill.failed",
                        "severity": "warning",
                        "message": f"skill {skill.name!r} was not installed: {exc}",
                        "details": {"name": skill.name},
                    },
                )

    async def report_containment(self) -> None:
        """PROTOCOL §9: once at start, what the provider tree can see that it should not."""
        from driver import containment

        await anyio.to_thread.run_sync(containment.prefix)  # chosen by now, unless no provider started
        for payload in containment.take_degraded():
            await self.k.emit("diagnostic.reported", payload)

    async def boot(self) -> None:
        """Install skills, start the provider, then report `driver.started`."""
        k = self.k
        await self.install_skills()
        if self.proxy is not None:
            await self.proxy.start()
        await k.supervisor.boot()
        await self.report_containment()
        start_ms = k.supervisor.start_ms
        timings = {
            "boot_ms": round((time.monotonic() - k.started_monotonic) * 1000, 1),
            "provider_start_ms": round(start_ms, 1) if start_ms is not None else None,
        }
        await k.emit(
            "driver.started",
            {
                "epoch": k.epoch,
                "revision": k.boot.execution.revision,
                "runtime": k.boot.execution.runtime,
                "capabilities": k.capability_list(),
                "timings": timings,
            },
        )


async def _restore_files(k: Kernel) -> Restored | str:
    """The restore's figures, or why it failed (a `checkpoint.<code>: ...` reason)."""
    from driver.checkpoints import restore

    checkpoint = k.boot.execution.native_checkpoint
    assert checkpoint is not None
    try:
        return await restore.restore(checkpoint, k.boot.execution.runtime, k.checkpoints.layout, k.boot.session.cwd)
    except restore.RestoreFailed as exc:
        return str(exc)
    except Exception as exc:  # no input may take the driver down: an unforeseen failure falls back too
        log.exception("checkpoint.restore_error")
        return f"checkpoint.failed: {type(exc).__name__}: {exc}"


def _encode_ref(ref: NativeResume) -> str:
    return json.dumps({"runtime": ref.runtime, "value": ref.value})


def _decode_ref(text: str | None) -> NativeResume | None:
    if not text:
        return None
    try:
        raw = json.loads(text)
        return NativeResume(runtime=raw["runtime"], value=raw["value"])
    except (ValueError, KeyError, TypeError):
        log.warning("native_session.unreadable")
        return None
