"""Serve one registered version from a process of its own (run as a script, not imported).

    python -P lineage/serving/model_worker.py <local model folder> [<MiniLM attention dtype>]

The attention dtype (default float32) is the serving contract's ``model_dtype`` of the
rollout asking, so both sides of a canary run MiniLM's attention in the same dtype.

The parent (``lineage.serving.version_runners.VersionWorker``) copies the version's files from
its storage location and checks them against the signed file manifest; this process
loads that checked copy with ``mlflow.pyfunc.load_model``, which puts the version's code
snapshot first on ``sys.path`` before anything of ours is imported; so the kernel, the
encoder and the wrapper that run are the version's, whatever the checkout holds. (``-P``
keeps this script's folder off ``sys.path``.) Two versions with different code run side
by side as two such processes. The code digest it reports is computed from the files of
the folder it loaded (``code/``), never taken from the loaded model's ``describe()``.

Protocol, over stdin/stdout: each message is an 8-byte little-endian length and a
pickle (both ends are this project's own processes on one machine). The first reply is
``{"ok": True, "describe": ...}`` once the model is loaded, or ``{"ok": False,
"error": ...}``. Then one reply per request ``{"op": ..., ...}``:

* ``embed`` (``texts``, optional ``interpreter``) -> ``embeddings`` float32 ``[n, 384]``,
  ``seconds``, ``interpreter``
* ``attention`` (``q, k, v, causal, scale, q_lengths, kv_lengths``, optional
  ``interpreter``) -> ``out``, ``interpreter``

``interpreter`` is the parent's Pallas interpreter choice (``kernels.interpreters``:
``tpu_interpret`` or ``generic_interpret``), applied where the version's code has the
choice; the reply names what its code ran (``tpu_interpret`` for code that predates it).
* ``compile_for`` (``shape``: ``AttentionShape`` fields, ``seed``) -> ``seconds``,
  ``compiler_bytes``: random inputs drawn and the call compiled ahead of time
* ``call_compiled`` (``shape``) -> ``seconds`` of one device-synchronised call
* ``memory_stats`` -> ``stats`` (the device allocator's, or ``None``)
* ``shutdown``

Every time is measured here, around a call that blocks until the device is done, so
the pipe never enters a latency. Library output goes to stderr; stdout carries only
the protocol.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
import time
import traceback


def _read(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _write(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _handlers(model):
    import jax
    import numpy as np

    from kernels.shapes import AttentionShape, random_inputs
    from kernels.timing import compiler_peak_bytes

    prepared: dict = {}

    def interpreter(msg):
        # The parent's Pallas interpreter choice (kernels.interpreters), where this
        # version's code has the choice; older code runs TPU interpret mode, and says so.
        try:
            from kernels import interpreters
        except ImportError:
            return contextlib.nullcontext("tpu_interpret")
        return _entered(interpreters, msg.get("interpreter") or interpreters.current())

    def embed(msg):
        with interpreter(msg) as name:
            start = time.perf_counter()
            out = np.asarray(model.embed(msg["texts"]), dtype=np.float32)
            seconds = time.perf_counter() - start
        return {"embeddings": out, "seconds": seconds, "interpreter": name}

    def attention(msg):
        lengths = {n: None if msg.get(n) is None else jax.numpy.asarray(msg[n])
                   for n in ("q_lengths", "kv_lengths")}
        with interpreter(msg) as name:
            out = model.attention(*(jax.numpy.asarray(msg[n]) for n in "qkv"),
                                  causal=msg["causal"], scale=msg["scale"], **lengths)
            out = np.asarray(jax.block_until_ready(out))
        return {"out": out, "interpreter": name}

    def compile_for(msg):
        shape = AttentionShape(**msg["shape"])
        q, k, v = random_inputs(shape, msg["seed"])
        start = time.perf_counter()
        lengths = shape.kv_lengths()  # a shape with a fill: its padding masked, as served
        compiled = jax.jit(lambda q, k, v: model.attention(q, k, v, causal=shape.causal,
                                                           kv_lengths=lengths)
                           ).lower(q, k, v).compile()
        prepared[shape] = (compiled, (q, k, v))
        return {"seconds": time.perf_counter() - start,
                "compiler_bytes": compiler_peak_bytes(compiled)}

    def call_compiled(msg):
        compiled, args = prepared[AttentionShape(**msg["shape"])]
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        return {"seconds": time.perf_counter() - start}

    def memory_stats(msg):
        try:
            return {"stats": jax.devices()[0].memory_stats()}
        except Exception:  # noqa: BLE001 - CPU and some plugins keep no statistics
            return {"stats": None}

    return {"embed": embed, "attention": attention, "compile_for": compile_for,
            "call_compiled": call_compiled, "memory_stats": memory_stats,
            "shutdown": lambda msg: {}}


@contextlib.contextmanager
def _entered(interpreters, name: str):
    with interpreters.interpreter(name):
        yield name


def _code_digest(folder: str) -> str:
    """``lineage.model.code_digest`` of the ``code/`` files of the loaded folder, computed
    here from the bytes (pycache excluded: this process may have just written it)."""
    import hashlib
    from pathlib import Path

    code = Path(folder) / "code"
    files = sorted((p.relative_to(code).as_posix(), p) for p in code.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    lines = "".join(f"{name} {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for name, p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def main(argv: list[str]) -> int:
    """Load ``argv[1]`` and answer requests until ``shutdown`` or end of input."""
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr
    requests = sys.stdin.buffer
    try:
        import mlflow.pyfunc

        model = mlflow.pyfunc.load_model(argv[1]).unwrap_python_model()
        attention_dtype = argv[2] if len(argv) > 2 else "float32"
        # a version built before serving contracts has no attention dtype: float32
        current = getattr(model.encoder.config, "attention_dtype", "float32")
        if attention_dtype != current:
            if not hasattr(model.encoder, "with_attention_dtype"):
                raise RuntimeError(f"this version's code cannot run MiniLM's attention in "
                                   f"{attention_dtype} (it predates serving contracts)")
            model.encoder = model.encoder.with_attention_dtype(attention_dtype)
        handlers = _handlers(model)
        _write(protocol_out, {"ok": True, "describe": {
            **model.describe(), "code_sha256": _code_digest(argv[1]),
            "attention_dtype": getattr(model.encoder.config, "attention_dtype", "float32")}})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        _write(protocol_out, {"ok": False, "error": f"{type(err).__name__}: {err}",
                              "traceback": traceback.format_exc()})
        return 1
    while (message := _read(requests)) is not None:
        op = message.get("op")
        try:
            reply = {"ok": True, **handlers[op](message)}
        except Exception as err:  # noqa: BLE001 - a failing kernel is an answer, not a crash
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        _write(protocol_out, reply)
        if op == "shutdown":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
