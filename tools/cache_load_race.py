"""Does loading cuDNN attention programs from JAX's persistent compilation cache in several
threads at once crash the process? The reproduction of the rollout segfaults seen on an H100.

``python -m tools.cache_load_race fill CACHE`` compiles (one thread) a set of cuDNN
fused-attention programs (``jax.nn.dot_product_attention(implementation="cudnn")``, bf16 and
f16, head_dim 64/128, causal and not, four lengths) into the cache folder CACHE;
``... load CACHE THREADS`` then calls each once from THREADS threads in a fresh process, so
every call deserializes a cached executable, and prints how many ran. A crash ends the
process with exit code 139 (SIGSEGV) or 136 (SIGFPE), or cuDNN's ``graph.deserialize``
fails (exit 1). ``... nocache THREADS`` compiles them concurrently with no cache.
``... precompile CACHE THREADS`` warms the same shapes through the registry's ``cudnn`` and
``evaluation.accuracy.precompile`` (what a rollout's evaluation does; run it twice, the
first fills CACHE). Needs a GPU with cuDNN attention (sm80+).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor


def shapes():
    """(dtype name, seq_len, head_dim, causal) of every program the reproduction compiles."""
    return [(dt, s, d, c) for dt in ("bfloat16", "float16") for d in (64, 128)
            for c in (False, True) for s in (256, 512, 1024, 2048)]


def _precompile(threads: int) -> int:
    import jax.numpy as jnp
    import numpy as np

    import kernels
    from evaluation.accuracy import precompile
    from evaluation.cases import make_case

    cases = []
    for i, (dt, s, d, c) in enumerate(shapes()):
        x = np.ones((1, s, 12, d), np.float32).astype(jnp.dtype(dt))
        cases.append(make_case(case_id=f"s{i}", category="ordinary", tags=(), q=x, k=x, v=x,
                               causal=c, source="cache_load_race"))
    fn = kernels.get_attention_fn("cudnn")
    seconds = precompile(cases, {"cudnn": fn}, workers=threads)
    # precompile ignores a failed call (the scoring call meets it again): count what ran
    print(f"precompile: {len(fn.resolutions)} of {len(cases)} programs in {seconds:.1f} s, "
          f"asked for {threads} threads", flush=True)
    return 0 if len(fn.resolutions) == len(cases) else 1


def _parse(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tools.cache_load_race", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 every program ran; a crash ends the process (139 SIGSEGV, "
        "136 SIGFPE) or fails cuDNN's deserialization (1).")
    parser.add_argument("mode", choices=("fill", "load", "nocache", "precompile"),
                        help="fill CACHE (one thread); load CACHE THREADS from it; nocache "
                        "THREADS with no cache; precompile CACHE THREADS through "
                        "evaluation.accuracy.precompile")
    parser.add_argument("args", nargs="*", help="CACHE and/or THREADS, as the mode takes")
    ns = parser.parse_args(argv)
    takes = {"fill": "CACHE", "load": "CACHE THREADS", "nocache": "THREADS",
             "precompile": "CACHE THREADS"}[ns.mode]
    threads_ok = not takes.endswith("THREADS") or (
        ns.args[-1:] and ns.args[-1].isascii() and ns.args[-1].isdigit()
        and int(ns.args[-1]) >= 1)
    if len(ns.args) != len(takes.split()) or not threads_ok:
        parser.error(f"{ns.mode} takes {takes}"
                     f"{' (THREADS at least 1)' if 'THREADS' in takes else ''}, got {ns.args}")
    return [ns.mode, *ns.args]


def main(argv: list[str]) -> int:
    """Run the mode named by ``argv[0]``; returns the exit status."""
    argv = _parse(argv)
    import jax
    import jax.numpy as jnp

    mode = argv[0]
    if jax.default_backend() != "gpu":
        print(f"cache_load_race {mode}: cuDNN attention needs an NVIDIA GPU; the backend is "
              f"{jax.default_backend()}", file=sys.stderr)
        return 2
    if mode in ("fill", "load", "precompile"):
        jax.config.update("jax_compilation_cache_dir", argv[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    threads = int(argv[-1]) if mode != "fill" else 1
    if mode == "precompile":
        return _precompile(threads)

    def call(shape):
        dt, s, d, c = shape
        x = jnp.ones((1, s, 12, d), getattr(jnp, dt))
        f = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=c,
                                                                  implementation="cudnn"))
        return float(jax.block_until_ready(f(x, x, x)).astype(jnp.float32).sum())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        done = list(pool.map(call, shapes()))
    print(f"{mode}: {len(done)} programs in {time.perf_counter() - t0:.1f} s, {threads} threads",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
