"""A sample GPU node for the fake NVML, shared by the agent's tests and its benchmark.

8 GPUs of three models. GeForce cards have no ECC and no MIG ("not supported"), A100s
have both, the T4 has ECC but no MIG. One is lost, one is too hot, one has uncorrected
ECC errors, one is split into MIG devices. Feed it to ``write_devices``.
"""

GTX = "NVIDIA GeForce GTX 1070"
A100 = "NVIDIA A100 80GB PCIe"
T4 = "Tesla T4"

# Slot 2 is empty (a destroyed MIG device leaves a gap). Slot 3 has the name older
# drivers give, without the profile; its profile comes from nvmlDeviceGetAttributes:
# 2 GPU slices, 1 compute slice, 19968 MB of 81920 MiB -> "1c.2g.20gb".
MIG_DEVICES = [
    dict(
        slot=0,
        uuid="MIG-1d89abd8-d10a-5361-bd06-77a807048470",
        name=f"{A100} MIG 1g.10gb",
        memory_total_mib=9728,
        memory_used_mib=1024,
        gi_slices=1,
        ci_slices=1,
        memory_size_mb=9856,
        gi_id=13,
        ci_id=0,
    ),
    dict(
        slot=1,
        uuid="MIG-1d89abd8-d10a-5361-bd06-77a807048471",
        name=f"{A100} MIG 3g.40gb",
        memory_total_mib=40192,
        memory_used_mib=0,
        gi_slices=3,
        ci_slices=3,
        memory_size_mb=40320,
        gi_id=2,
        ci_id=0,
    ),
    dict(
        slot=3,
        uuid="MIG-1d89abd8-d10a-5361-bd06-77a807048473",
        name=A100,
        memory_total_mib=19968,
        memory_used_mib=0,
        gi_slices=2,
        ci_slices=1,
        memory_size_mb=19968,
        gi_id=5,
        ci_id=1,
    ),
]

MIXED_NODE = [
    dict(
        index=0,
        uuid="GPU-0a1b2c3d-0000-4000-8000-000000000000",
        name=GTX,
        memory_total_mib=8192,
        memory_used_mib=2048,
        util_gpu=63,
        temp_c=71,
        processes=[{"pid": 4242, "used_mib": 1900}],
    ),
    dict(
        index=1,
        uuid="GPU-0a1b2c3d-0000-4000-8000-000000000001",
        name=GTX,
        memory_total_mib=8192,
        memory_used_mib=0,
        util_gpu=0,
        temp_c=35,
    ),
    dict(
        index=2,
        uuid="GPU-0a1b2c3d-0000-4000-8000-000000000002",
        name=GTX,  # lost
        memory_total_mib=8192,
        memory_used_mib=0,
        util_gpu=0,
        temp_c=0,
        lost=True,
    ),
    dict(
        index=3,
        uuid="GPU-0a1b2c3d-0000-4000-8000-000000000003",
        name=GTX,  # hot
        memory_total_mib=8192,
        memory_used_mib=512,
        util_gpu=100,
        temp_c=93,
        processes=[{"pid": 777, "used_mib": 500}],
    ),
    dict(
        index=4,
        uuid="GPU-a100a100-0000-4000-8000-000000000004",
        name=A100,
        memory_total_mib=81920,
        memory_used_mib=40960,
        util_gpu=88,
        temp_c=60,
        ecc_uncorrected=0,
        mig=False,
        processes=[{"pid": 1001, "used_mib": 30720}, {"pid": 1002, "used_mib": 10240}],
    ),
    dict(
        index=5,
        uuid="GPU-a100a100-0000-4000-8000-000000000005",
        name=A100,  # ECC errors
        memory_total_mib=81920,
        memory_used_mib=0,
        util_gpu=0,
        temp_c=42,
        ecc_uncorrected=2,
        mig=False,
    ),
    dict(
        index=6,
        uuid="GPU-a100a100-0000-4000-8000-000000000006",
        name=A100,  # MIG on
        memory_total_mib=81920,
        memory_used_mib=1024,
        util_gpu=0,
        temp_c=38,
        ecc_uncorrected=0,
        mig=True,
        mig_devices=MIG_DEVICES,
        processes=[{"pid": 2024, "used_mib": 1000}],
    ),
    dict(
        index=7,
        uuid="GPU-7e57a7e5-0000-4000-8000-000000000007",
        name=T4,
        memory_total_mib=15360,
        memory_used_mib=300,
        util_gpu=12,
        temp_c=55,
        ecc_uncorrected=0,
        mig=None,
        processes=[{"pid": 31337, "used_mib": 290}],
    ),
]
