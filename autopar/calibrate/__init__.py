"""Calibration: measure a cluster with microbenchmarks and fit the cost model's hardware profile to it.

    autopar calibrate --out my_cluster.yaml                       # one process: GEMMs (and memory on a GPU)
    torchrun --nnodes 2 --nproc-per-node 8 ... -m autopar.calibrate --out my_cluster.yaml   # + NVLink and IB

Modules, top to bottom:

- `measurements`: the raw data (GEMM timings, collective timings, memory overheads) as frozen dataclasses, with
  median and inter-quartile range, and the one strict reader of a measurements section (no NaN, no half-used file).
- `fit`: least squares (numpy only) of the cost model's own parameters — alpha and bandwidth of
  `costmodels.comm.collective_time_s` per link, the named GEMM-efficiency parameters of
  `costmodels.compute.gemm_efficiency` — with relative residuals.
- `profile_file`: a calibrated profile from a bundled base profile + fit + measurements, validated by
  `costmodels.hardware.parse_profile` and written atomically (temp file, fsync, rename).
- `compare`: the summary behind `autopar profile show` (calibrated values against the bundled profile of the GPU).
- `bench` and `runner`: the torch microbenchmarks and the distributed driver. Only these import torch, and only
  `autopar calibrate` imports them.

Nothing in this package imports torch at module level; `bench` and `runner` import it when they run.
"""
