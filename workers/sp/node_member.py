"""A device worker's part in serving queue requests: the forwards of the requests its SP group samples.

The node agent runs the rollout worker's own request code and hands it its group as the policy
(workers/sp/group_policy.py); this is the other end. Each member holds a PolicyHolder (workers/rollout/weights.py),
so it reaches a request's weights version through the PULSE chain and reads prompt embeddings from the store's
prompt cache (a member fed from the cache never loads a text encoder). Ops, each -> the fields of its reply:

- `probe`: policy_for(request), then which SP degrees up to max_degree split it -> degrees
- `join`: leaves its group, forms group `prefix` as rank/world (Ulysses turns on at the next prepare) -> leave_s, init_s
- `prepare`: policy_for(request) at the group's degree (ValueError when it does not fit), Ulysses on -> shape,
  device_type, kernel_set (what the group's forwards compute with: workers/rollout/kernels.py)
- `sigmas`: the policy's noise levels for num_steps -> sigmas
- `encode`: the conditioning of the prompts, text padded for the degree (kept for velocity) -> (no fields)
- `velocity`: one forward of the group under the request sampler's autocast -> rank 0: v (fp32)
- `decode`: (rank 0) the VAE's images of final latents (the pixel policy's samples are images) -> images
- `status`: what the process loaded (text encoders, VAE) -> loaded
- `explore`: an exploration request alone, at degree 1 (Ulysses off): the rollout worker's
  `work_explore_request` -> result_key, events

A bad request (a field the policy cannot serve, a degree that does not fit, weights the store lacks, a run on
another model than `--model`) answers `error` with the exception's type; a failed collective (a member died)
answers `broken`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from resources.queue.records import Request
from resources.store import open_store
from resources.store.base import StoreError
from workers.algo.sampler import SamplerConfig, autocast_for, sample_shape, sampler_sigmas
from workers.explore.request import work_explore_request
from workers.rollout.kernels import kernel_labels
from workers.rollout.state import RolloutSpec
from workers.rollout.weights import ModelMismatchError, PolicyHolder
from workers.sp.model_sp import sp_degrees, sp_view
from workers.sp.ulysses import disable_sp, enable_sp, init_group, leave_group
from workers.task.prompt_row import fields_negative, set_row_negatives

REQUEST_ERRORS = (ModelMismatchError, ValueError, LookupError, StoreError)
"""What a bad request raises, most specific first: the agent re-raises the first type that matches."""


class RequestMember:
    def __init__(self, worker_id: str, store_url: str, device: str, rendezvous, model: str | None = None):
        self.worker_id = worker_id
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # this worker's GPU is the current one for every library it calls
        self.holder = PolicyHolder(open_store(store_url), device=device, model=model)
        self.rendezvous = rendezvous
        self.rank, self.degree = 0, 1
        self.hooked = None
        """The policy whose transformer carries the group's context-parallel hooks (None at degree 1)."""
        self.spec = self.view = self.sp = self.cond = None

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, "_op_" + msg["op"], None)
        if handler is None:
            return {"op": "error", "error_type": "ValueError", "error": f"unknown op {msg['op']!r}"}
        t0 = time.perf_counter()
        try:
            reply = handler(msg)
        except REQUEST_ERRORS as err:
            kind = next(base.__name__ for base in REQUEST_ERRORS if isinstance(err, base))  # what the agent re-raises
            reply = {"op": "error", "error_type": kind, "error": str(err)}
        except RuntimeError as err:  # gloo: "Connection closed by peer" when a member died mid-collective
            reply = {"op": "broken", "error": str(err)[:300]}
        reply.setdefault("op", msg["op"])
        reply.update(worker_id=self.worker_id, seconds=time.perf_counter() - t0)
        return reply

    def _op_probe(self, msg):
        spec = RolloutSpec.from_payload(msg["payload"])
        view = self.holder.policy_for(spec)
        return {"degrees": sp_degrees(view, int(msg["max_degree"]), [spec.prompt])}

    def _op_join(self, msg):
        t0 = time.perf_counter()
        leave_group(self.hooked)
        self.hooked = self.spec = self.view = self.sp = self.cond = None
        t1 = time.perf_counter()
        init_group(
            self.rendezvous,
            msg["prefix"],
            msg["rank"],
            msg["world_size"],
            self.device,
            timeout_s=msg.get("timeout_s", 30.0),
        )
        self.rank, self.degree = msg["rank"], msg["world_size"]
        return {"leave_s": t1 - t0, "init_s": time.perf_counter() - t1, "enable_s": 0.0, "warmup_s": 0.0}

    def _op_prepare(self, msg):
        spec = RolloutSpec.from_payload(msg["payload"])
        view = self.holder.policy_for(spec)
        set_row_negatives(view, fields_negative(spec.prompt, spec.prompt_fields))  # as the rollout worker's _Stepper
        sp = sp_view(view, self.degree)  # ValueError when the group's degree cannot split this policy
        self._hook(view)
        self.spec, self.view, self.sp, self.cond = spec, view, sp, None
        labels = kernel_labels(self.device)
        if self.degree > 1:  # Ulysses' all-to-all sums in another order than one member (tests/workers/sp)
            labels["kernel_set"] += f", SP degree {self.degree}"
        return {"shape": list(sample_shape(view)), **labels}

    def _hook(self, view) -> None:
        """Ulysses on the view's transformer at the group's degree (views of one policy share the transformer)."""
        if self.degree == 1 or (self.hooked is not None and self.hooked.transformer is view.transformer):
            return
        if self.hooked is not None:
            disable_sp(self.hooked)
            self.hooked = None
        enable_sp(view, self.degree)
        self.hooked = view

    def _op_sigmas(self, msg):
        self._need_prepared()
        config = SamplerConfig(num_steps=int(msg["num_steps"]), shift=float(msg["shift"]))
        return {"sigmas": sampler_sigmas(self.view, config).numpy()} if self.rank == 0 else {}

    def _op_encode(self, msg):
        self._need_prepared()
        self.cond = self.sp.encode_prompts(list(msg["prompts"]))  # grad mode as the rollout worker's _Stepper
        return {}

    @torch.no_grad()
    def _op_velocity(self, msg):
        if self.cond is None:
            raise ValueError("velocity before encode: the agent must send the prompts first")
        x = torch.from_numpy(msg["x"]).to(self.device)
        sigma = torch.from_numpy(msg["sigma"]).to(self.device)
        with autocast_for(self.spec.sampler, self.device):  # what denoise_step does around the forward
            v = self.sp.velocity(x, sigma, *self.cond)
        return {"v": v.float().cpu().numpy()} if self.rank == 0 else {}

    def _op_decode(self, msg):
        self._need_prepared()
        latents = torch.from_numpy(msg["latents"])
        decode = getattr(self.view, "decode", None)  # as workers.task.render.decode_images
        images = decode(latents) if callable(decode) else latents
        return {"images": images.float().cpu().numpy()}

    def _op_explore(self, msg):
        """One exploration request on this member alone. Ulysses comes off the transformer first (a forward with
        the hooks would wait for the group); the next rollout's prepare turns it on again."""
        if self.hooked is not None:
            disable_sp(self.hooked)
        self.hooked = self.spec = self.view = self.sp = self.cond = None
        events = []

        def report(event: str, **fields) -> None:  # the agent prints them, with the time they happened
            events.append({"event": event, **fields, "t": time.time()})

        outcome = work_explore_request(
            Request.from_dict(msg["request"]),
            self.holder.store,
            self.holder,
            worker_id=msg["worker_id"],
            attempt=int(msg["attempt"]),
            report=report,
        )
        return {"status": outcome.status, "result_key": outcome.result_key, "events": events}

    def _op_status(self, msg):
        policy = self.holder.policy
        frozen = getattr(policy, "frozen", None)
        return {
            "loaded": list(frozen.loaded) if frozen is not None else [],
            "run": self.holder.run,
            "version": self.holder.version,
        }

    def _need_prepared(self) -> None:
        if self.view is None:
            raise ValueError("no request prepared on this member (prepare comes first, and again after a join)")

    def close(self) -> None:
        try:
            leave_group(self.hooked)
        except RuntimeError:
            pass  # the group is already broken; the process is exiting anyway
