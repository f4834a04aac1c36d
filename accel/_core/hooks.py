"""The hooks of one accelerator, called the way its handle needs them: one typed method
per hook, so mypy checks every call's arguments and result.

Every call goes through pluggy's own call loop, with pluggy's subset hook caller of the
accelerator (the other accelerators' plugins removed), built once per hook and kept
until a plugin is added or removed. Who raised or gave an answer accel cannot use is
read from pluggy's hook implementation (:mod:`accel._core.blame`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, final

import torch
from torch import nn

from accel._core.blame import who_answered
from accel._core.compiling import runnable_backend
from accel._core.listing import FALLBACKS_NAME, HookCall, hook_call
from accel._util.names import describe_index_range, visibility_hint
from accel._util.notes import REPORT_TO_AUTHORS
from accel.errors import AcceleratorNotFoundError, AcceleratorUnavailableError, PluginError
from accel.training.checkpoint._restoring import restored_tensors_problem
from accel.training.memory import memory_stats_problem
from accel.tying._keeping import MOVED_BY_NOTE
from accel.types import Availability, MemoryStats, MoveContext

if TYPE_CHECKING:
    import os

    import pluggy

__all__ = ["FALLBACKS_NAME", "AcceleratorHooks", "no_longer_registered"]

_T = TypeVar("_T")


@final
class AcceleratorHooks:
    """The hooks of one accelerator, as its handle calls them."""

    __slots__ = ("_alive", "_calls", "_foreign", "_manager", "_providers", "name")

    def __init__(
        self,
        name: str,
        manager: pluggy.PluginManager,
        providers: dict[str, str],
        foreign: Callable[[], Iterable[object]],
    ):
        #: Canonical accelerator name, passed to every hook as ``accelerator``.
        self.name = name
        self._manager = manager  # the registry's one manager, shared
        self._providers = providers  # plugin name -> provider, shared with the dispatcher
        self._foreign = foreign  # the plugins of the registry's other accelerators
        self._calls: dict[str, HookCall] = {}
        self._alive = True

    # -- probing ------------------------------------------------------------------

    def availability(self, *, provider: str = "") -> Availability:
        """Ask whether the accelerator can be used; never raises.

        :param provider: who supplied the accelerator's plugin; a probe that raised is
            then unavailable with the remedy to fix the plugin or report it there.
        """
        try:
            return self._expect("is_available", Availability)
        except Exception as exc:
            remedy = f"fix the plugin, or report this to its authors ({provider})"
            return Availability(
                False,
                reason=f"probing it failed: {type(exc).__name__}: {exc}",
                remedy=remedy if provider else "",
            )

    def device_count(self) -> int:
        """The device count of an accelerator found available."""
        count, who = self._first("device_count")
        if isinstance(count, bool) or not isinstance(count, int):
            raise self._bad("device_count", f"returned {_shown(count)}; expected int", who)
        if count < 0:
            raise self._bad(
                "device_count", f"returned {count}; a device count cannot be negative", who
            )
        return count

    def device(self, index: int | None, *, requested: str, source: str = "") -> torch.device:
        """The device for ``index`` (``None``: the default one), checked against the count.

        :param requested: the name as the user wrote it, for the message.
        :param source: where that name came from (``" in $ACCEL_ACCELERATOR"``) or ``""``.
        """

        count = self.device_count()  # asked even without an index: a bad count fails early
        if index is not None and index >= count:
            raise AcceleratorUnavailableError(
                f"device index {index} requested ({requested!r}{source}) but "
                f"{self.name!r} has {count} device{'s' if count != 1 else ''} here "
                f"(valid: {', '.join(str(i) for i in range(count)) or 'none'}). "
                f"{_index_remedy(self.name, count)}",
                accelerator=self.name,
                reason=f"index {index} >= device count {count}",
            )
        return self._expect("get_device", torch.device, index=index)

    def distributed_backend(self) -> str:
        return self._expect("distributed_backend", str)

    # -- moves ----------------------------------------------------------------------

    def pre_move_hook(
        self, model: torch.nn.Module, device: torch.device, context: MoveContext
    ) -> None:
        self._call("pre_move_hook", model=model, device=device, context=context)

    def model_to_device(
        self, model: torch.nn.Module, device: torch.device, context: MoveContext
    ) -> torch.nn.Module:
        moved, who = self._first("model_to_device", model=model, device=device, context=context)
        if who != FALLBACKS_NAME:  # a plugin moved it (None: one of them, pluggy ran it)
            context.notes[MOVED_BY_NOTE] = self.describe(who, "model_to_device")
        if not isinstance(moved, nn.Module):
            raise self._bad(
                "model_to_device", f"returned {type(moved).__name__}, not a torch.nn.Module", who
            )
        return moved

    def post_move_hook(
        self, model: torch.nn.Module, device: torch.device, context: MoveContext
    ) -> None:
        self._call("post_move_hook", model=model, device=device, context=context)

    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        return self._call("batch_to_device", batch=batch, device=device)

    # -- the training step --------------------------------------------------------

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None,
        device: torch.device,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Any:
        call = self._calls.get("optimizer_step") or self._build("optimizer_step")
        return call.caller(
            accelerator=self.name,
            optimizer=optimizer,
            closure=closure,
            device=device,
            scaler=scaler,
        )

    def clip_grad_norm_(
        self,
        parameters: list[torch.Tensor],
        max_norm: float,
        norm_type: float,
        device: torch.device,
    ) -> torch.Tensor:
        norm, who = self._first(
            "clip_grad_norm_",
            parameters=parameters,
            max_norm=max_norm,
            norm_type=norm_type,
            device=device,
        )
        if not isinstance(norm, torch.Tensor):
            raise self._bad("clip_grad_norm_", f"returned {_shown(norm)}; expected a tensor", who)
        return norm

    def no_sync(
        self, model: torch.nn.Module, enabled: bool, device: torch.device
    ) -> AbstractContextManager[Any]:
        return self._context("no_sync", model=model, enabled=enabled, device=device)

    def grad_scaler(self, device: torch.device, options: dict[str, Any]) -> torch.amp.GradScaler:
        scaler, who = self._first("grad_scaler", device=device, options=options)
        missing = [
            name
            for name in ("scale", "unscale_", "step", "update")
            if not callable(getattr(scaler, name, None))
        ]
        if missing:
            raise self._bad(
                "grad_scaler",
                f"returned {type(scaler).__name__}, not a GradScaler (no {', '.join(missing)})",
                who,
            )
        return scaler  # type: ignore[no-any-return]

    def compile_backend(self, device: torch.device) -> str | Callable[..., Any]:
        backend, who = self._first("compile_backend", device=device)
        if not (isinstance(backend, str) and backend) and not callable(backend):
            raise self._bad(
                "compile_backend",
                f"returned {_shown(backend)}; expected a backend name or a backend callable",
                who,
            )
        return runnable_backend(backend, device)  # inductor only where it has codegen

    def mark_step(self, device: torch.device) -> None:
        call = self._calls.get("mark_step") or self._build("mark_step")
        call.caller(accelerator=self.name, device=device)

    def synchronize(self, device: torch.device) -> None:
        self._call("synchronize", device=device)

    def manual_seed(self, seed: int, device: torch.device) -> None:
        torch.manual_seed(seed)  # the host's generators are accel's (as in rng_state)
        self._call("manual_seed", seed=seed, device=device)

    def autocast(
        self, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any]:
        return self._context("autocast", device=device, dtype=dtype)

    def memory_stats(self, device: torch.device) -> MemoryStats:
        return self._vetted("memory_stats", memory_stats_problem, device=device)  # type: ignore[no-any-return]

    def device_loader(
        self, loader: Iterable[Any], device: torch.device, move: Callable[[Any], Any]
    ) -> Iterable[Any]:
        batches, who = self._first("device_loader", loader=loader, device=device, move=move)
        if not isinstance(batches, Iterable):
            raise self._bad(
                "device_loader", f"returned {type(batches).__name__}, not an iterable", who
            )
        return batches

    def state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        return self._expect("state_dict", dict, model=model)

    def save(self, obj: Any, path: str | os.PathLike[str]) -> None:
        self._call("save", obj=obj, path=path)

    def load(self, path: str | os.PathLike[str]) -> Any:
        return self._call("load", path=path)

    def restore_to_device(self, tensors: list[torch.Tensor], device: torch.device) -> Any:
        problem = partial(restored_tensors_problem, tensors, device=device)
        return self._vetted("restore_to_device", problem, tensors=tensors, device=device)

    def rng_state(self, device: torch.device) -> Any:
        return self._call("rng_state", device=device)

    def set_rng_state(self, state: Any, device: torch.device) -> None:
        self._call("set_rng_state", state=state, device=device)

    # -- what the handle's fast paths and messages need -----------------------------

    def answered_by_plugin(self, hook_name: str) -> bool:
        """Whether a plugin implements ``hook_name``, not accel's fallback alone (for
        ``mark_step``: a lazy graph (XLA) that a save must cut first)."""
        return not (self._calls.get(hook_name) or self._build(hook_name)).fallback_only

    def describe(self, plugin_name: str | None, hook_name: str) -> str:
        """Name the plugin that answered ``hook_name`` (``None``: not known, so every
        plugin that may have answered), with its provider, for messages."""
        if plugin_name == FALLBACKS_NAME:
            return "accel's built-in fallback"
        if plugin_name is not None:
            return f"plugin {plugin_name!r} ({self.provider_of(plugin_name)})"
        names = [
            impl.plugin_name
            for impl in self._build(hook_name).caller.get_hookimpls()
            if not (impl.wrapper or impl.hookwrapper) and impl.plugin_name != FALLBACKS_NAME
        ]
        if not names:
            return "accel's built-in fallback"
        return "plugin " + " or ".join(f"{n!r} ({self.provider_of(n)})" for n in reversed(names))

    def provider_of(self, plugin_name: str) -> str:
        return self._providers.get(plugin_name, "registered in code")

    # -- calling ----------------------------------------------------------------------

    def _call(self, hook_name: str, **kwargs: Any) -> Any:
        """Call the hook through pluggy's own loop (this accelerator's subset caller)."""
        call = self._calls.get(hook_name) or self._build(hook_name)
        try:
            result = call.caller(accelerator=self.name, **kwargs)
        except Exception as exc:
            self._check_alive(exc)
            raise
        return result

    def _first(self, hook_name: str, **kwargs: Any) -> tuple[Any, str | None]:
        """A first-result hook's answer, and the plugin that gave it (``None``: nobody
        answered, or a plugin's wrapper may have changed the answer)."""
        call = self._calls.get(hook_name) or self._build(hook_name)
        try:
            result = call.caller(accelerator=self.name, **kwargs)
        except Exception as exc:
            self._check_alive(exc)
            raise
        if result is None or call.has_wrapper:
            return result, None
        return result, who_answered()

    def _context(self, hook_name: str, **kwargs: Any) -> AbstractContextManager[Any]:
        """A first-result hook's answer, checked to be a context manager."""
        context, who = self._first(hook_name, **kwargs)
        if not (hasattr(context, "__enter__") and hasattr(context, "__exit__")):
            raise self._bad(
                hook_name, f"returned {type(context).__name__}, not a context manager", who
            )
        return context  # type: ignore[no-any-return]

    def _expect(self, hook_name: str, expected: type[_T], **kwargs: Any) -> _T:
        """A first-result hook's answer, checked to be an ``expected`` (bool is no int)."""
        result, who = self._first(hook_name, **kwargs)
        if isinstance(result, expected) and not (isinstance(result, bool) and expected is int):
            return result
        raise self._bad(hook_name, f"returned {_shown(result)}; expected {expected.__name__}", who)

    def _vetted(self, hook_name: str, problem: Callable[[Any], str | None], **kwargs: Any) -> Any:
        """A first-result hook's answer, unless ``problem`` finds it wrong (then raised)."""
        result, who = self._first(hook_name, **kwargs)
        if (found := problem(result)) is not None:
            raise self._bad(hook_name, found, who)
        return result

    def _bad(self, hook_name: str, problem: str, who: str | None) -> Exception:
        """The :class:`~accel.PluginError` for a result accel cannot use (``problem``:
        ``"returned list ([]), expected dict"``), naming the plugin that gave it."""
        return PluginError(
            f"hook {hook_name!r} for accelerator {self.name!r} {problem}, from "
            f"{self.describe(who, hook_name)}. {REPORT_TO_AUTHORS}"
        )

    def _check_alive(self, exc: Exception | None = None) -> None:
        """Raise :func:`no_longer_registered` where the accelerator's plugin has left
        (a call that raised may have reached the fallbacks in its place)."""
        if not self._alive:
            raise no_longer_registered(self.name) from exc

    def _build(self, hook_name: str) -> HookCall:
        """The hook's call for this accelerator, cached until a plugin is added or
        removed (the dispatcher then calls :meth:`_forget`)."""
        if not self._alive:
            raise no_longer_registered(self.name)
        calls = self._calls
        call = calls.get(hook_name)
        if call is None:
            call = hook_call(self._manager, hook_name, self._foreign())
            calls[hook_name] = call
        return call

    # -- kept in step with the registry by the dispatcher -------------------------

    def _retire(self) -> None:
        # The calls built stay: a call that already has its hooks finishes with them.
        self._alive = False

    def _forget(self) -> None:
        if self._alive:
            self._calls = {}  # a new dict: a call in flight keeps the one it read


def _shown(value: object) -> str:
    return f"{type(value).__name__} ({value!r})"


def _index_remedy(accelerator: str, count: int) -> str:
    if accelerator == "cpu":
        return "The CPU accelerator has one device: use 'cpu'."
    hint = visibility_hint(accelerator)  # named by its device type (cuda), or no hint
    also = f", or check {hint}" if hint else ""
    return f"Ask for {describe_index_range(accelerator, count)}{also}."


def no_longer_registered(accelerator: str) -> AcceleratorNotFoundError:
    return AcceleratorNotFoundError(
        f"accelerator {accelerator!r} is no longer registered in this registry (its plugin "
        f"was unregistered); select one again with get_accelerator()",
        requested=accelerator,
        known=[],
        suggestion=None,
    )
