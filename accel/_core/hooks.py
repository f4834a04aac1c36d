"""The hooks of one accelerator, called the way its handle needs them: one typed method
per hook, so mypy checks every call's arguments and result.

Every call goes through pluggy's own call loop (``PluginManager._hookexec``, what
``HookCaller.__call__`` runs) with the accelerator's implementations of the hook (the
other accelerators' plugins removed), read once per hook under the dispatch lock and kept
until a plugin is added or removed. Who raised, or gave an answer accel cannot use, is
read from pluggy's hook implementation: at registration each implementation is wrapped
in :func:`blamed`, which notes the plugin on what it raises and records who gave a
first-result answer. It lives here, not in a module of its own, so a hook call enters
no accel module beyond this one and the implementation's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast, final

import torch
from torch import nn

from accel._core.listing import (
    FALLBACKS_NAME,
    HookCall,
    count_problem,
    hook_call,
    index_error,
    no_longer_registered,
    note_blame,
    plugins_plain,
    shown,
)
from accel._util.notes import REPORT_TO_AUTHORS
from accel.errors import PluginError
from accel.training._compiling import runnable_backend
from accel.training.checkpoint._restoring import restored_tensors_problem
from accel.training.memory import memory_stats_problem
from accel.training.step import scaler_problem
from accel.types import Availability, MemoryStats, MoveContext

if TYPE_CHECKING:
    import os

    import pluggy

__all__ = ["AcceleratorHooks", "blamed"]

_T = TypeVar("_T")


@final
class AcceleratorHooks:
    """The hooks of one accelerator, as its handle calls them."""

    __slots__ = ("_alive", "_calls", "_foreign", "_lock", "_manager", "_providers", "name")

    def __init__(
        self,
        name: str,
        manager: pluggy.PluginManager,
        providers: dict[str, str],
        foreign: Callable[[], Iterable[object]],
        lock: threading.RLock,
    ):
        #: Canonical accelerator name, passed to every hook as ``accelerator``.
        self.name = name
        self._manager = manager  # the registry's one manager, shared
        self._providers = providers  # plugin name -> provider, shared with the dispatcher
        self._foreign = foreign  # the plugins of the registry's other accelerators
        self._lock = lock  # the dispatcher's: held while the manager or the owners change
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
        return self._vetted("device_count", count_problem)  # type: ignore[no-any-return]

    def device(self, index: int | None, *, requested: str, source: str = "") -> torch.device:
        """The device for ``index`` (``None``: the default one), checked against the count.

        :param requested: the name as the user wrote it, for the message.
        :param source: where that name came from (``" in $ACCEL_ACCELERATOR"``) or ``""``.
        """
        count = self.device_count()  # asked even without an index: a bad count fails early
        if index is not None and index >= count:
            raise index_error(self.name, index, count, f"{requested!r}{source}")
        return self._expect("get_device", torch.device, index=index)

    def distributed_backend(self) -> str:
        return self._expect("distributed_backend", str)

    # -- moves ----------------------------------------------------------------------

    def pre_move_hook(self, model: nn.Module, device: torch.device, context: MoveContext) -> None:
        self._call("pre_move_hook", model=model, device=device, context=context)

    def model_to_device(
        self, model: nn.Module, device: torch.device, context: MoveContext
    ) -> tuple[nn.Module, str]:
        """The moved module, and the plugin that moved it as messages name it (``""``:
        accel's fallback, so no plugin to blame for what the move changed)."""
        moved, who = self._first("model_to_device", model=model, device=device, context=context)
        if not isinstance(moved, nn.Module):
            raise self._bad(
                "model_to_device", f"returned {type(moved).__name__}, not a torch.nn.Module", who
            )
        movers = self._answerers(who, "model_to_device")
        return moved, self._named(movers) if movers else ""

    def post_move_hook(self, model: nn.Module, device: torch.device, context: MoveContext) -> None:
        self._call("post_move_hook", model=model, device=device, context=context)

    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        # A hot call (every batch of every step): it skips _call's frame, as mark_step.
        call = self._calls.get("batch_to_device") or self._build("batch_to_device")
        kwargs = {"accelerator": self.name, "batch": batch, "device": device}
        return call.execute("batch_to_device", call.implementations, kwargs, True)

    # -- the training step --------------------------------------------------------

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None,
        device: torch.device,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Any:
        call = self._calls.get("optimizer_step") or self._build("optimizer_step")
        kwargs = {
            "accelerator": self.name,
            "optimizer": optimizer,
            "closure": closure,
            "device": device,
            "scaler": scaler,
        }
        return call.execute("optimizer_step", call.implementations, kwargs, True)

    def clip_grad_norm_(
        self,
        parameters: list[torch.Tensor],
        max_norm: float,
        norm_type: float,
        device: torch.device,
    ) -> torch.Tensor:
        return self._expect(
            "clip_grad_norm_",
            torch.Tensor,
            "a tensor",
            parameters=parameters,
            max_norm=max_norm,
            norm_type=norm_type,
            device=device,
        )

    def no_sync(
        self, model: nn.Module, enabled: bool, device: torch.device
    ) -> AbstractContextManager[Any]:
        return self._context("no_sync", model=model, enabled=enabled, device=device)

    def grad_scaler(self, device: torch.device, options: dict[str, Any]) -> torch.amp.GradScaler:
        return self._vetted("grad_scaler", scaler_problem, device=device, options=options)  # type: ignore[no-any-return]

    def compile_backend(self, device: torch.device) -> str | Callable[..., Any]:
        backend, who = self._first("compile_backend", device=device)
        if not (isinstance(backend, str) and backend) and not callable(backend):
            raise self._bad(
                "compile_backend",
                f"returned {shown(backend)}; expected a backend name or a backend callable",
                who,
            )
        return runnable_backend(backend, device)  # inductor only where it has codegen

    def mark_step(self, device: torch.device) -> None:
        # The hot calls skip _call's frame; what they raise is noted by blamed.
        call = self._calls.get("mark_step") or self._build("mark_step")
        kwargs = {"accelerator": self.name, "device": device}
        call.execute("mark_step", call.implementations, kwargs, True)

    def synchronize(self, device: torch.device) -> None:
        call = self._calls.get("synchronize") or self._build("synchronize")
        kwargs = {"accelerator": self.name, "device": device}
        call.execute("synchronize", call.implementations, kwargs, True)

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
        return self._shaped(  # type: ignore[no-any-return]
            "device_loader", Iterable, "an iterable", loader=loader, device=device, move=move
        )

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
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
        plain implementation that may have answered), with its provider, for messages."""
        return self._named(self._answerers(plugin_name, hook_name))

    def _named(self, names: list[str]) -> str:
        """``names`` (plugins) as messages name them, with their providers."""
        if not names:
            return "accel's built-in fallback"
        return "plugin " + " or ".join(
            f"{name!r} ({self._providers.get(name, 'registered in code')})" for name in names
        )

    def _answerers(self, plugin_name: str | None, hook_name: str) -> list[str]:
        """The plugins that gave (``None``: may have given) ``hook_name``'s answer, in
        pluggy's call order; empty where accel's fallback did."""
        if plugin_name is not None:
            return [plugin_name] if plugin_name != FALLBACKS_NAME else []
        implementations = (self._calls.get(hook_name) or self._build(hook_name)).implementations
        return [impl.plugin_name for impl in plugins_plain(implementations)]

    # -- calling ----------------------------------------------------------------------

    def _call(self, hook_name: str, **kwargs: Any) -> Any:
        """Call the hook through pluggy's own loop with this accelerator's hooks."""
        call = self._calls.get(hook_name) or self._build(hook_name)
        kwargs["accelerator"] = self.name
        return call.execute(hook_name, call.implementations, kwargs, call.firstresult)

    def _first(self, hook_name: str, **kwargs: Any) -> tuple[Any, str | None]:
        """A first-result hook's answer, and the plugin that gave it (``None``: nobody
        answered, or a plugin's wrapper ran around the answer and may have changed it)."""
        result = self._call(hook_name, **kwargs)
        return result, None if result is None else getattr(_answered, "who", None)

    def _context(self, hook_name: str, **kwargs: Any) -> AbstractContextManager[Any]:
        """A first-result hook's answer, checked to be a context manager."""
        context = self._shaped(hook_name, AbstractContextManager, "a context manager", **kwargs)
        return context  # type: ignore[no-any-return]

    def _shaped(self, hook_name: str, expected: type, what: str, /, **kwargs: Any) -> Any:
        """A first-result hook's answer, checked to be an ``expected`` (``what``: a
        context manager, an iterable: what the message says it is not)."""
        result, who = self._first(hook_name, **kwargs)
        if not isinstance(result, expected):
            raise self._bad(hook_name, f"returned {type(result).__name__}, not {what}", who)
        return result

    def _expect(self, hook_name: str, expected: type[_T], what: str = "", /, **kwargs: Any) -> _T:
        """A first-result hook's answer, checked to be an ``expected`` (``what``: the
        name the message gives it, if not the class's)."""
        result, who = self._first(hook_name, **kwargs)
        if isinstance(result, expected):
            return result
        problem = f"returned {shown(result)}; expected {what or expected.__name__}"
        raise self._bad(hook_name, problem, who)

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

    def _build(self, hook_name: str) -> HookCall:
        """The hook's call for this accelerator, cached until a plugin is added or
        removed (the dispatcher then calls :meth:`_forget`). Read under the dispatch
        lock: the implementations and the other accelerators' plugins of one moment,
        never a plugin registered half-way through (it would answer for this one)."""
        with self._lock:
            if not self._alive:
                raise no_longer_registered(self.name)
            if hook_name not in self._calls:
                self._calls[hook_name] = hook_call(self._manager, hook_name, self._foreign())
            return self._calls[hook_name]

    # -- kept in step with the registry by the dispatcher (under its lock) ----------

    def _retire(self) -> None:
        self._alive = False
        self._calls = {}  # the next call raises; one in flight finishes with its hooks

    def _forget(self) -> None:
        self._calls = {}  # a new dict: a call in flight keeps the snapshot it read


# -- blame: naming the plugin at fault, from pluggy's hook implementation ----------

# Per thread: the plugin whose implementation last gave a first-result hook's answer.
_answered = threading.local()


def blamed(
    impl: pluggy.HookImpl,
    hook_name: str,
    provider_of: Callable[[str], str],
    firstresult: bool,
) -> Callable[..., Any]:
    """``impl``'s function, naming its plugin on what it raises (an exception note)
    and recording it as the answerer of a first-result hook (read by ``_first``): a
    plain implementation that answered, or, for a wrapper, nobody (it may have changed
    the answer)."""
    function = impl.function
    name = impl.plugin_name

    if impl.wrapper or impl.hookwrapper:

        def wrapper(*args: Any) -> Generator[Any, Any, Any]:
            try:
                result = yield from cast("Generator[Any, Any, Any]", function(*args))
            except Exception as exc:  # an inner implementation's is noted already
                note_blame(exc, hook_name, name, provider_of(name))
                raise
            _answered.who = None
            return result

        return wrapper

    def plain(*args: Any) -> Any:
        try:
            result = function(*args)
        except Exception as exc:
            note_blame(exc, hook_name, name, provider_of(name))
            raise
        if firstresult and result is not None:
            _answered.who = name
        return result

    return plain
