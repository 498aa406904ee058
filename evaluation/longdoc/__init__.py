"""A long-document serving workload: where attention is a large share of a request.

``spec`` (the frozen YAML spec: encoder, lengths, arrivals, buckets, budget, SLO,
price), ``arrivals`` (the seeded open-loop stream), ``encoder`` (the seeded, fingerprinted
long-context encoder, attention through the kernel contract), ``batcher`` (length
buckets within a token budget), ``loadgen`` (the discrete-event replay: queue and
compute apart), ``server`` (a batch measured for real on the device), ``report`` (the
figures per request, per bucket and overall), ``run`` (one spec, one implementation),
``bench`` (two kernels on the same arrivals), ``effect`` (the per-bucket effect with an
interval), ``plots`` and ``figures`` (plots of a comparison, and of committed results).
"""
