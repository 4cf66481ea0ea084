"""Where an owner's capacity limit stops a replica that fits (issue 37, item 5).

Pure: a plan (a GGUF file's or a safetensors model's), the owner, the quota policy and
what each scope holds now in; the plan with a sentence where a replica fits on room but
not under the owner's limit: "fits on cpu-1, but team:Acme/ml is at its capacity limit
(17 GPUs of 16)". The limit is tenancy's own rule (tenancy.quota.Policy.at_limit), asked
about what one replica would hold (fleet.domain.holdings.profile_amount).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TypeVar

from fleet.domain.holdings import profile_amount
from tenancy.quota import Amount, Policy

from .gpus import GpuOption, gpu_profile
from .hf_sizing import HfPlan
from .sizing import Plan

P = TypeVar("P", Plan, HfPlan)


def with_owner_limit(plan: P, owner: str, policy: Policy, usage: Mapping[str, Amount]) -> P:
    """`plan` with the owner's limit said on each option that fits now (and, for a GGUF
    file, on the CPU profile); unchanged for no owner, or one the limit does not stop."""
    if not owner:
        return plan
    engine = "vllm" if isinstance(plan, HfPlan) else "llamacpp"
    gpus = tuple(_said(o, engine, owner, policy, usage) for o in plan.gpus)
    plan = replace(plan, gpus=gpus)
    if isinstance(plan, Plan) and plan.fits:
        need = Amount(0, plan.cpu_cores, float(plan.memory_gb))
        if why := policy.at_limit(owner, usage, need):
            # mypy also tries this for P=HfPlan as an HfPlan-and-Plan, which has no quota.
            plan = replace(plan, quota=f"fits on {', '.join(plan.fits)}, but {why}")  # type: ignore[call-arg]
    return plan


def _said(
    option: GpuOption, engine: str, owner: str, policy: Policy, usage: Mapping[str, Amount]
) -> GpuOption:
    profile = gpu_profile(option, engine=engine)
    if profile is None or not option.fits:
        return option
    if why := policy.at_limit(owner, usage, profile_amount(profile)):
        return replace(option, quota=f"fits on {', '.join(option.fits)}, but {why}")
    return option
