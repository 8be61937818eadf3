"""Engine: many requests, one model, one K/V pool.

`step()` is plan → check → execute → sample → commit: the scheduler plans the step, the runner
checks and executes it (the gates run when a shape is recorded, and on every replay), the
sampler picks the next tokens, and commit appends them and retires what finished.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch

from nanoserve.runtime.decode.recordings import Backend
from nanoserve.runtime.decode.warmup import Clock, WarmEstimate, WarmPlan, WarmupReport
from nanoserve.runtime.engine.config.engine_config import (
    EngineConfig,
    ResolvedConfig,
    without_decoding,
)
from nanoserve.runtime.engine.engine_parts import build_parts
from nanoserve.runtime.engine.engine_status import EngineStatus, PrefixCacheCounts
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams, check_pooling
from nanoserve.runtime.engine.requests.request_check import RequestError, check_request
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step import verify
from nanoserve.runtime.engine.step.block_manager import PrefixCacheStats
from nanoserve.runtime.engine.step.kv_events import KVEvent
from nanoserve.runtime.engine.step.pooling import commit_pooled
from nanoserve.runtime.engine.step.pooling_state import PoolingCounts, PoolingState
from nanoserve.runtime.engine.step.runner import Executed
from nanoserve.runtime.engine.step.sampler import SampleResult, sample
from nanoserve.runtime.engine.step.scheduler import SchedulerOutput
from nanoserve.runtime.engine.step.sequence import (
    Delta,
    Sequence,
    Status,
    pooling_sequence,
    request_sequences,
)
from nanoserve.runtime.engine.step.verify import RowGroup, accepted_drafts, append_kept
from nanoserve.runtime.kernels.cpu_features import cpu_features
from nanoserve.runtime.loading.pooler_config import GENERATE
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.pooler import Pooler
from nanoserve.runtime.model.served_model import ServedModel
from nanoserve.runtime.structured.grammar_compiler import GrammarCompiler
from nanoserve.runtime.structured.grammar_spec import GrammarSpec
from nanoserve.runtime.structured.token_masks import TokenMasks
from nanoserve.runtime.text.chat_template import ChatTemplate
from nanoserve.runtime.text.rerank_prompt import pair_prompt
from nanoserve.runtime.text.tokenizer import Tokenizer


class Engine:
    def __init__(
        self,
        model: ServedModel,
        tokenizer: Tokenizer,
        config: ResolvedConfig,
        *,
        backend: Backend | None = None,
        chat_template: ChatTemplate | None = None,
        name: str = "model",
        boot_started: float | None = None,
        draft: LlamaModel | None = None,
        pooler: Pooler | None = None,
    ) -> None:
        """boot_started: perf_counter() when the boot began, for `mark_ready`'s seconds; draft:
        speculative method draft_model's draft (its tokenizer the target's: build.py checks);
        pooler: what the model serves (None: generation)."""
        if model.config.whole_inputs:  # nothing to record, time or draft
            config = without_decoding(config, pooler.task if pooler else "generate")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.name = name
        self.boot_started = boot_started
        self.ready_seconds: float | None = None
        self.pooler = pooler or Pooler(GENERATE, logits=model.logits)
        self.generates = self.pooler.task == "generate"  # an embedder or reranker does not
        cfg = model.config
        parts = build_parts(model, config, backend, draft)
        self.memory, self.pool, self.blocks = parts.memory, parts.pool, parts.blocks
        self.state_plan, self.pool_plan = parts.state_plan, parts.pool_plan
        self.prefix_caching = self.memory.prefix_caching
        self.step_timings, self.prefill_budget = parts.step_timings, parts.prefill_budget
        self.speculator, self.scheduler, self.runner = (
            parts.speculator,
            parts.scheduler,
            parts.runner,
        )
        self.eos_token_ids = frozenset(cfg.eos_token_ids) | frozenset(tokenizer.eos_token_ids)
        self.grammars = GrammarCompiler(
            tokenizer, vocab_size=cfg.vocab_size, eos_token_ids=sorted(self.eos_token_ids)
        )
        self.token_masks = TokenMasks(
            cfg.vocab_size, config.max_batch, pin=model.device.type == "cuda"
        )
        self._requests: dict[str, list[Sequence]] = {}
        self._seq_ids = itertools.count()
        self.warm_report: WarmupReport | None = None
        self.finished = Counter[str]()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_steps = 0
        self.pooling = PoolingCounts()
        # Unseeded sampling draws from the engine's own generator, never the process's.
        self.generator = torch.Generator(device=model.device).manual_seed(config.seed)

    @classmethod
    def from_config(
        cls, model: ServedModel, tokenizer: Tokenizer, config: EngineConfig, **kwargs: Any
    ) -> Engine:
        """An engine over a model already built: config resolved against that model (its
        positions, and its weight form for quantize "auto"). build_engine resolves before it
        builds the model, and calls the constructor."""
        resolved = config.resolve(
            model_max_len=model.config.max_position_embeddings, auto_quantize=model.quantize
        )
        return cls(model, tokenizer, resolved, **kwargs)

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_ids: Seq[int], params: SamplingParams | PoolingParams
    ) -> None:
        if request_id in self._requests:
            raise RequestError("request_id", f"request {request_id!r} is already running")
        self.check_request(prompt_ids, params)
        if isinstance(params, PoolingParams):
            state = PoolingState(params, self.pooler.method)
            seq = pooling_sequence(
                request_id,
                prompt_ids,
                state,
                next(self._seq_ids),
                block_size=self.config.block_size,
                tokenizer=self.tokenizer,
            )
            self.scheduler.add([seq])
            self._requests[request_id] = [seq]
            return
        spec = params.grammar
        seqs = request_sequences(
            request_id,
            prompt_ids,
            params,
            self._seq_ids,
            block_size=self.config.block_size,
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            device=self.pool.device,
            grammar=None if spec is None else lambda: self.grammars.matcher(spec),
        )
        # Parallel samples wait for the first one's prompt, then share its cached blocks.
        if self.prefix_caching:
            for seq in seqs[1:]:
                seq.after = seqs[0].seq_id
        self.scheduler.add(seqs)
        self._requests[request_id] = seqs
        self.prompt_tokens += len(prompt_ids)

    def check_request(self, prompt_ids: Seq[int], params: SamplingParams | PoolingParams) -> None:
        if isinstance(params, PoolingParams):
            limit = min(self.config.max_model_len, self.pool_plan.num_slots)
            if self.scheduler.whole_prompts:  # an input is one step's chunk
                limit = min(limit, self.config.max_num_batched_tokens)
            check_pooling(prompt_ids, params, self.pooler, self.model.config, limit)
            return
        if not self.generates:
            raise RequestError(
                "model", f"the model {self.name} serves {self.pooler.task}, it does not generate"
            )
        check_request(
            prompt_ids,
            params,
            vocab=self.model.config.vocab_size,
            max_model_len=self.config.max_model_len,
            pool_slots=self.pool_plan.num_slots,
        )
        if params.grammar is not None:
            self.grammars.compile(params.grammar)  # a bad grammar is refused here, cached else

    def compile_grammar(self, spec: GrammarSpec) -> None:
        """Compile spec now (raising GrammarError), so that admitting it later is a cache hit."""
        self.grammars.compile(spec)

    def abort(self, request_id: str) -> list[Delta]:
        """Finish a request now and free its blocks; returns its last deltas."""
        deltas = []
        for seq in self._requests.pop(request_id, []):
            if not seq.finished:
                seq.finish("abort")
                self._retire(seq)
                deltas.append(seq.take_delta())
        return deltas

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Waiting sequences (a request of n samples counts n)."""
        return len(self.scheduler.waiting)

    # -- the step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Delta]:
        out = self._plan()
        if not out.scheduled:
            self.blocks.publish()  # the plan may have evicted
            return []
        started = time.perf_counter()
        executed = self._execute(out)  # checked (at record time) and run
        groups, result = self._sample(out, executed.logits)
        if self.speculator is not None:  # the price of a token, as this step says
            self.speculator.observe_time(out, time.perf_counter() - started)
        deltas = self._commit(out, groups, result, executed.hidden)
        self.blocks.publish()
        return deltas

    # The phases of a step, each a method so that a test's engine (tests/faults.py) can wrap one.

    def _plan(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        for seq_id in out.preempted:
            self.runner.release(seq_id)
        return out

    def _execute(self, out: SchedulerOutput) -> Executed:
        self.pool.states.copy(out.restores)  # prefix hits start from their checkpoints
        return self.runner.execute(out)  # logits [rows that sample, vocab], pooled rows

    def _sample(
        self, out: SchedulerOutput, logits: torch.Tensor
    ) -> tuple[list[RowGroup], SampleResult]:
        groups = verify.group_rows(self.scheduler.seqs_of(out), out.scheduled)
        # The grammar masks of the constrained rows (one row each: never a verify row)
        grammars = [(g.first, g.seq.grammar) for g in groups if g.seq.grammar is not None]
        mask = self.token_masks.fill(grammars)
        result = sample(logits, verify.sample_rows(groups), self.generator, mask)
        self.num_steps += 1
        return groups, result

    def _commit(
        self,
        out: SchedulerOutput,
        groups: list[RowGroup],
        result: SampleResult,
        hidden: Mapping[int, torch.Tensor],
    ) -> list[Delta]:
        """Each sequence takes its token (a verify row: its kept draft, then the target's); a
        pooling sequence its hidden states, and its answer once its prompt is in."""
        accepted = accepted_drafts(groups, result.token_ids)
        seqs = self.scheduler.seqs_of(out)
        self.pool.states.copy(self.scheduler.commit(out, accepted))  # checkpoints saved
        deltas = []
        if hidden or any(item.pool is not None for item in out.scheduled):
            self.pooling.tokens += commit_pooled(seqs, out.scheduled, hidden, self.pooler)
            for seq in seqs:
                if seq.pooling is not None and seq.finished:
                    self.pooling.requests += 1
                    self._retire(seq)
                    deltas.append(seq.take_delta())
        if accepted and self.speculator is not None:
            self.speculator.observe_step(accepted, {g.seq.seq_id: len(g.draft) for g in groups})
        for group in groups:
            self.generation_tokens += append_kept(group, result, accepted.get(group.seq.seq_id, 0))
            if group.seq.finished:
                self._retire(group.seq)
            deltas.append(group.seq.take_delta())
        return deltas

    def _retire(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self.runner.release(seq.seq_id)
        if self.speculator is not None:
            self.speculator.forget(seq.seq_id)
        self.finished[seq.finish_reason or "abort"] += 1
        seqs = self._requests.get(seq.request_id)
        if seqs is not None and all(s.finished for s in seqs):
            del self._requests[seq.request_id]

    def run_until_done(self) -> list[Delta]:
        deltas = []
        while self.has_unfinished:
            deltas.extend(self.step())
        return deltas

    # -- KV-cache events --------------------------------------------------------------------

    def attach_kv_events(self, sink: Callable[[list[KVEvent]], object] | None) -> None:
        """From now on, each step's prefix-cache changes go to sink (which must not block: it
        runs on the step thread); None turns them off. The cache is cleared first, so the
        stream starts from a state its subscribers know: its first event is AllBlocksCleared."""
        self.blocks.send_events(sink)
        if sink is not None:
            self.reset_prefix_cache()

    def reset_prefix_cache(self) -> int:
        """Forget every cached block; how many were named. Running sequences keep their blocks
        and name them again from the root, so no later event names a parent it cleared."""
        named = self.blocks.reset_prefix_cache()
        for seq in self.scheduler.running:
            seq.block_hashes.clear()
        self.blocks.publish()
        return named

    # -- warm-up ----------------------------------------------------------------------------

    def plan_warm(self) -> WarmPlan:
        """The warm list this engine's config and memory allow (decode_mode="recorded")."""
        return self.runner.plan_warm()

    def warm(
        self,
        plan: WarmPlan | None = None,
        *,
        cancel: threading.Event | None = None,
        announce: Callable[[WarmPlan, WarmEstimate], None] | None = None,
        clock: Clock = time.perf_counter,
    ) -> WarmupReport:
        """Record plan (default: `plan_warm()`) within the config's time budget; the report is
        kept as `warm_report`. From then on a shape outside the list runs eagerly."""
        self.warm_report = self.runner.warm(
            plan or self.plan_warm(), cancel=cancel, announce=announce, clock=clock
        )
        return self.warm_report

    def mark_ready(self) -> float | None:
        """The boot is over: keep and return its seconds (None without boot_started)."""
        if self.boot_started is not None:
            self.ready_seconds = time.perf_counter() - self.boot_started
        return self.ready_seconds

    def destroy(self) -> None:
        """Free the recordings (a clean shutdown); the engine still serves, eagerly."""
        if self.runner.recordings is not None:
            self.runner.recordings.destroy()

    # -- numbers ----------------------------------------------------------------------------

    def reset_counters(self) -> None:
        self.finished.clear()
        self.prompt_tokens = self.generation_tokens = self.num_steps = 0
        self.pooling = PoolingCounts()
        self.blocks.stats = PrefixCacheStats()
        if self.speculator is not None:
            self.speculator.reset_counters()

    def default_max_tokens(self, prompt_len: int) -> int:
        """An unset max_tokens: as long as the context allows and the pool can hold (a pool
        smaller than max_model_len would otherwise refuse every request that leaves it
        unset)."""
        context = min(self.config.max_model_len, self.pool_plan.num_slots)
        return max(1, context - prompt_len)

    def render_chat(
        self,
        messages: Seq[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: object,
    ) -> str:
        if self.chat_template is None:
            raise RequestError("messages", f"the model {self.name} has no chat template")
        return self.chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, **extra
        )

    def score_prompt(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        """A (query, document) pair as the reranker reads it: a cross-encoder's two segments,
        or a decoder's yes/no prompt (text/rerank_prompt.py)."""
        segments = self.model.config.encoder is not None
        return pair_prompt(self.tokenizer, query, document, instruction, segments=segments)

    @property
    def template_reads_tools(self) -> bool:
        return self.chat_template is not None and self.chat_template.reads_tools

    @property
    def template_thinks(self) -> bool:
        return self.chat_template is not None and self.chat_template.thinks

    def check_blocks(self) -> None:
        self.blocks.check(idle=not self.has_unfinished)
        if self.speculator is not None:  # a draft model's pool too
            self.speculator.check_blocks(idle=not self.has_unfinished)

    def status(self) -> EngineStatus:
        """The engine's status now, what /health and /metrics read: taken between steps or
        during one, each number read once (consistent field by field, not across fields)."""
        config, model, stats = self.config, self.model, self.blocks.stats
        recordings = self.runner.recordings
        return EngineStatus(
            model=self.name,
            dtype=config.dtype,
            quantize=config.quantize,
            device=config.device,
            cpu=cpu_features().describe(),
            threads=config.threads,
            kernels=model.kernels,
            weights=model.weight_types,
            weight_fallbacks=model.weight_fallbacks,
            decode_mode=config.decode_mode.value,
            prefill_budget=self.prefill_budget,
            max_model_len=config.max_model_len,
            ready_seconds=self.ready_seconds,
            pool=self.pool_plan,
            state=self.state_plan,
            state_slots_in_use=self.scheduler.state_slots.num_used,
            blocks_in_use=self.blocks.num_in_use,
            kv_cache_usage=self.blocks.usage(),
            warm=self.warm_report,
            recordings=recordings.stats() if recordings is not None else None,
            running=self.num_running,
            waiting=self.num_waiting,
            waiting_requests=len({seq.request_id for seq in tuple(self.scheduler.waiting)}),
            prefix_cache=PrefixCacheCounts(stats.queried_tokens, stats.hit_tokens),
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            finished=dict(self.finished),
            steps=self.num_steps,
            speculation=self.speculator.counts() if self.speculator is not None else None,
            task=self.pooler.task,
            pooler=self.pooler.describe() if self.pooler.task != "generate" else None,
            pooling_requests=self.pooling.requests,
            pooling_tokens=self.pooling.tokens,
            experts=usage.as_dict() if (usage := model.expert_usage) is not None else None,
        )


__all__ = ["Engine", "RequestError", "Status"]
