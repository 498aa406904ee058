"""A long-context encoder in JAX whose architecture is declared by the workload spec.

No long-context pretrained weights ship in a package here, so the weights are drawn
from a seed (normal, ``init_std``) and fingerprinted: :func:`weights_sha256` hashes
every parameter's name, dtype, shape and bytes. What that means: the *cost* of serving
(speed, memory, failures under load) is real, since it depends on shapes and dtypes,
not on trained values; outputs are synthetic activations, so output drift measured
here says nothing about task quality (accuracy stays with the test set and MiniLM).

Architecture (ModernBERT-like, Warner et al. 2024, arXiv:2412.13663): token embedding
and a bias-free LayerNorm; per layer, pre-norm attention with rotary position embedding
(RoPE, Su et al. 2021, arXiv:2104.09864; global attention in every layer) and a
pre-norm GeGLU MLP (Shazeer 2020, arXiv:2002.05202); a final norm; mean pooling over
the valid tokens. Attention goes through the kernel contract: every layer calls an
``AttentionFn`` (``kernels.api``) with ``q``/``k``/``v`` ``[batch, seq, heads,
head_dim]`` in the spec's dtype and ``kv_lengths`` masking the padding, exactly as the
MiniLM model does (``evaluation.model``). Norms and pooling run in float32.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from evaluation.longdoc.spec import EncoderSpec
from kernels.api import AttentionFn


def init_params(spec: EncoderSpec) -> dict:
    """Seeded weights: matrices ``N(0, init_std^2)`` in ``spec.dtype``, norm gains 1.

    Returns:
        a pytree: ``embed`` ``[vocab, hidden]``, ``norm_emb``, ``norm_out`` ``[hidden]``,
        ``layers``: the layers stacked on a leading ``[layers]`` axis (one program for all
        of them under ``lax.scan``, so compiling 22 layers costs about one): ``qkv``
        ``[L, hidden, 3, heads*head_dim]``, ``o`` ``[L, heads*head_dim, hidden]``, ``wi``
        ``[L, hidden, 2*mlp_hidden]``, ``wo`` ``[L, mlp_hidden, hidden]``, ``norm_attn``,
        ``norm_mlp`` ``[L, hidden]``.
    """
    dtype = jnp.dtype(spec.dtype)
    inner = spec.heads * spec.head_dim
    keys = iter(jax.random.split(jax.random.key(spec.seed), 5))

    def normal(shape):
        return (spec.init_std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    def ones(*lead):
        return jnp.ones((*lead, spec.hidden), jnp.float32)

    n = spec.layers
    layers = {"qkv": normal((n, spec.hidden, 3, inner)), "o": normal((n, inner, spec.hidden)),
              "wi": normal((n, spec.hidden, 2 * spec.mlp_hidden)),
              "wo": normal((n, spec.mlp_hidden, spec.hidden)),
              "norm_attn": ones(n), "norm_mlp": ones(n)}
    return {"embed": normal((spec.vocab, spec.hidden)), "norm_emb": ones(),
            "norm_out": ones(), "layers": layers}


def weights_sha256(params: dict) -> str:
    """sha256 hex over every parameter, in path order: its path, dtype, shape and bytes
    (C order). Two seeds give two fingerprints; the same seed the same one."""
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        arr = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{arr.dtype.str}|{arr.shape}\n".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _norm(x, gain, eps):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps) * gain).astype(x.dtype)


def _rope(x, theta: float):
    """Rotary embedding over the last axis of ``[batch, seq, heads, head_dim]`` (halves)."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2.0 / dim)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = (f(angles)[None, :, None, :] for f in (jnp.cos, jnp.sin))
    x32 = x.astype(jnp.float32)
    a, b = x32[..., : dim // 2], x32[..., dim // 2:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(x.dtype)


def _qkv(x, layer, spec: EncoderSpec):
    batch, seq, _ = x.shape
    h = _norm(x, layer["norm_attn"], spec.norm_eps)
    qkv = jnp.einsum("bsh,hti->bsti", h, layer["qkv"])
    q, k, v = (qkv[:, :, i].reshape(batch, seq, spec.heads, spec.head_dim) for i in range(3))
    return _rope(q, spec.rope_theta), _rope(k, spec.rope_theta), v


def _layer(x, layer, lengths, attention_fn: AttentionFn, spec: EncoderSpec):
    q, k, v = _qkv(x, layer, spec)
    attn = attention_fn(q, k, v, causal=False, scale=None, q_lengths=None, kv_lengths=lengths)
    attn = jnp.asarray(attn, dtype=x.dtype).reshape(x.shape[0], x.shape[1], -1)
    x = x + attn @ layer["o"]
    h = _norm(x, layer["norm_mlp"], spec.norm_eps) @ layer["wi"]
    gate, up = jnp.split(h, 2, axis=-1)
    return x + (jax.nn.gelu(gate, approximate=True) * up) @ layer["wo"]


def _layers(x, stacked, lengths, attention_fn: AttentionFn, spec: EncoderSpec):
    """Every layer of ``stacked`` (leading axis: layers) in order, under ``lax.scan``."""
    if jax.tree_util.tree_leaves(stacked)[0].shape[0] == 0:
        return x

    def step(h, layer):
        return _layer(h, layer, lengths, attention_fn, spec), None

    return jax.lax.scan(step, x, stacked)[0]


def _embed(params, ids, spec: EncoderSpec):
    return _norm(params["embed"][ids], params["norm_emb"], spec.norm_eps)


def encode(params, ids, lengths, *, attention_fn: AttentionFn, spec: EncoderSpec):
    """Mean-pooled document embeddings.

    Args:
        params: :func:`init_params`'s pytree.
        ids: int32 ``[batch, seq]`` token ids (padding anywhere past ``lengths``).
        lengths: int32 ``[batch]`` valid tokens per row (1 <= length <= seq).
        attention_fn: ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths)``.
        spec: the architecture (a static argument under ``jax.jit``).

    Returns:
        float32 ``[batch, hidden]``.
    """
    x = _layers(_embed(params, ids, spec), params["layers"], lengths, attention_fn, spec)
    x = _norm(x, params["norm_out"], spec.norm_eps).astype(jnp.float32)
    mask = (jnp.arange(x.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
    return jnp.sum(x * mask[..., None], axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)[:, None]


def layer_qkv(params, ids, lengths, *, attention_fn: AttentionFn, spec: EncoderSpec,
              layer: int):
    """The ``(q, k, v)`` the encoder feeds to attention at ``layer`` (0-based), each
    ``[batch, seq, heads, head_dim]`` in ``spec.dtype`` (RoPE applied to q and k).

    Raises:
        ValueError: ``layer`` outside ``[0, spec.layers)``.
    """
    if not 0 <= layer < spec.layers:
        raise ValueError(f"layer must lie in [0, {spec.layers}), got {layer}")
    first = jax.tree_util.tree_map(lambda a: a[:layer], params["layers"])
    x = _layers(_embed(params, ids, spec), first, lengths, attention_fn, spec)
    return _qkv(x, jax.tree_util.tree_map(lambda a: a[layer], params["layers"]), spec)


encode_jit = jax.jit(encode, static_argnames=("attention_fn", "spec"))
layer_qkv_jit = jax.jit(layer_qkv, static_argnames=("attention_fn", "spec", "layer"))


class LongDocEncoder:
    """The encoder of one spec: its seeded weights and their fingerprint.

    Attributes:
        spec: the architecture.
        params: the weights (on the default device).
        weights_sha256: :func:`weights_sha256` of ``params`` (lineage).
    """

    def __init__(self, spec: EncoderSpec):
        self.spec = spec
        self.params = init_params(spec)
        self.weights_sha256 = weights_sha256(self.params)

    @classmethod
    @functools.lru_cache(maxsize=2)
    def for_spec(cls, spec: EncoderSpec) -> LongDocEncoder:
        """One encoder per spec and process (weights drawn and hashed once)."""
        return cls(spec)

    def document_ids(self, request_id: int, tokens: int, seed: int = 0) -> np.ndarray:
        """A synthetic document's token ids: int32 ``[tokens]``, uniform over the
        vocabulary, seeded by ``(seed, request_id)`` (the same on every kernel)."""
        rng = np.random.default_rng((seed, request_id))
        return rng.integers(0, self.spec.vocab, size=tokens, dtype=np.int32)

    def weights_facts(self) -> dict[str, str]:
        """What the weights are, for lineage (seeded, not trained: see the module)."""
        return {"name": "longdoc-encoder (seeded, untrained)", "seed": str(self.spec.seed),
                "parameters": str(self.spec.parameter_count()), "dtype": self.spec.dtype,
                "sha256": self.weights_sha256}
