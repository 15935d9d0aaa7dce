"""The trace contract as data: which span carries which attributes and events, when and from what to what.

The names are ``semconv``'s (referenced, never retyped); this table says where they go. The docs'
trace-contract table is generated from it (``python -m otel_llm.core.readme_tables``; a test checks the
page matches), and tests can hold emitted spans against it (``attribute_names``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import semconv as sc


@dataclass(frozen=True)
class Item:
    """An attribute (or, with ``event``, an event) of a span, with what the docs say about it."""

    name: str
    note: str = ""  # follows the name: a condition, the values, the meaning
    lead: str = ""  # precedes the name: introduces a group ("and its engine step's facts: ")
    event: bool = False

    def render(self) -> str:
        return f"{self.lead}{'event ' if self.event else ''}`{self.name}`{self.note}"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Group:
    """Attributes the docs write as one entry (a family of names: ``llm.slow.<cause>``)."""

    names: tuple[str, ...]
    text: str
    event: bool = False

    def render(self) -> str:
        return self.text


@dataclass(frozen=True)
class SpanDoc:
    names: tuple[str, ...]  # one row may document several spans of the same shape
    kind: str
    when: str
    start_end: str
    items: tuple[Item | Group, ...] = ()
    tail: str = ""  # after the items: what is not an attribute (links, status)
    shown_name: str = ""  # how the docs write the name, where it is a template

    def attribute_names(self) -> tuple[str, ...]:
        return tuple(n for i in self.items if not i.event for n in i.names)

    def event_names(self) -> tuple[str, ...]:
        return tuple(n for i in self.items if i.event for n in i.names)


def _when_set(*names: str) -> tuple[Item, ...]:
    return tuple(Item(n, " (when set)") for n in names)


_STEP_FACTS = "and its engine step's facts: "


def _lead(lead: str, *names: str) -> tuple[Item, ...]:
    """A run of attributes introduced once."""
    return tuple(Item(n, lead=lead if i == 0 else "") for i, n in enumerate(names))


def _anatomy() -> tuple[Item, ...]:
    """The step's anatomy on a request's chunk or decode-step span: the parts the engine measured."""
    first, *rest = (sc.STEP_MODEL_TIME, sc.STEP_EXECUTE_TIME, sc.STEP_IDLE_BEFORE)
    return (Item(first, lead="and, where the engine measured them, its anatomy: "), *(Item(n) for n in rest))

# the production features' request facts (spans.feature_attributes): on the request span, or on each choice
# span of a request with n > 1 choices
_FEATURES = (*_lead("speculative decoding (vLLM; TensorRT-LLM: the drafted, accepted tokens and rate): ",
                    sc.SPEC_VERIFY_STEPS, sc.SPEC_DRAFT_TOKENS, sc.SPEC_ACCEPTED_TOKENS, sc.SPEC_ACCEPTANCE_RATE,
                    sc.SPEC_ACCEPTANCE_LENGTH),
             *_lead("cache reads by source (vLLM, where it reports them): ", sc.CACHE_READ_LOCAL,
                    sc.CACHE_READ_EXTERNAL),
             *_lead("LoRA adapter (vLLM): ", sc.LORA_NAME, sc.LORA_ID),
             *_lead("SLO operations (docs/verdict.md, \"Engine time\"): the tenant where the `tenant` option names "
                    "a source, the request's engine seconds and the prefill interference its prompt caused others: ",
                    sc.REQUEST_TENANT, sc.REQUEST_ENGINE_TIME, sc.REQUEST_INTERFERENCE_CAUSED),
             Item(sc.LORA_EVENT_LOADED, " per load of its adapter in a step that served it: the step span's "
                  f"event, same attributes (`{sc.LORA_NAME}`, `{sc.LORA_ID}`, `{sc.LORA_LOAD_TIME}`) and time",
                  event=True))

REQUEST_SPAN = SpanDoc(
    (), "SERVER under `vllm serve` / `trtllm-serve`, INTERNAL offline", "every kept request",
    "arrival → the frontend received the last output (`arrival + e2e`; TensorRT-LLM: its last token)",
    (Item(sc.OPERATION_NAME),
     Item(sc.PROVIDER_NAME, f"=`{sc.PROVIDER_VLLM}` or `{sc.PROVIDER_TENSORRT_LLM}`"),
     Item(sc.REQUEST_MODEL, " (what the client asked for: the API request's `model` under serve, else the "
          "served model's or adapter's name)"),
     Item(sc.REQUEST_MAX_TOKENS), Item(sc.REQUEST_TEMPERATURE), Item(sc.REQUEST_TOP_P),
     *_when_set(sc.REQUEST_TOP_K, sc.REQUEST_SEED, sc.REQUEST_FREQUENCY_PENALTY, sc.REQUEST_PRESENCE_PENALTY,
                sc.REQUEST_STOP_SEQUENCES, sc.REQUEST_CHOICE_COUNT),
     Item(sc.REQUEST_STREAM, " (under serve when streaming; TensorRT-LLM: whenever streamed)"),
     Item(sc.STRUCTURED_OUTPUT_BACKEND, " (vLLM, a request with a structured-output grammar: the backend "
          "compiling it)"),
     Item(sc.STRUCTURED_OUTPUT_CACHE_HIT, " (vLLM, a request with a grammar: reused from the backend's cache, or "
          "compiled anew; docs/verdict.md)"),
     Item(sc.RESPONSE_MODEL, " (what served it: the LoRA adapter's name for an adapter's request, else the "
          "served model name)"), Item(sc.RESPONSE_ID), Item(sc.RESPONSE_FINISH_REASONS),
     Item(sc.USAGE_INPUT_TOKENS), Item(sc.USAGE_OUTPUT_TOKENS),
     Item(sc.LATENCY_TTFT), Item(sc.LATENCY_TPOT), Item(sc.LATENCY_E2E), Item(sc.LATENCY_QUEUE),
     Item(sc.LATENCY_PREFILL), Item(sc.LATENCY_DECODE),
     Group((sc.VLLM_TTFT, sc.VLLM_E2E, sc.VLLM_QUEUE, sc.VLLM_PREFILL, sc.VLLM_DECODE, sc.VLLM_INFERENCE),
           f"`{sc.VLLM_TTFT}`, `{sc.VLLM_E2E}`, `{sc.VLLM_QUEUE}`, `{sc.VLLM_PREFILL}`, `{sc.VLLM_DECODE}`, "
           f"`{sc.VLLM_INFERENCE}` (vLLM's own request-span names, same values, for dashboards built on vLLM's "
           "tracing; `llm.latency.*` are canonical)"),
     Item(sc.LATENCY_MAX_GAP, " (the longest gap between two steps that produced tokens)"),
     Item(sc.LATENCY_ITL_COUNTS, " (its inter-token latencies as counts over `llm.server.inter_token.latency`'s "
          "buckets; both when it produced two or more tokens)"),
     Item(sc.NUM_PREEMPTIONS),
     Item(sc.USAGE_CACHE_READ_INPUT_TOKENS), Item(sc.OUTPUT_CHARACTERS),
     Item(sc.SLO_MET), Item(sc.SLO_BREACHED),
     Group(tuple(sc.SLO_THRESHOLDS.values()),
           ", ".join(f"`{n}`" for n in sc.SLO_THRESHOLDS.values()) + " (the SLO thresholds it was judged "
           "against, seconds: those set for its model, when SLOs are set)"),
     Item(sc.SAMPLING_REASON),
     Item(sc.ERROR_TYPE, " (`aborted`, `engine_error`) and ERROR status when failed, or aborted on an INTERNAL "
          "span (a SERVER span's abort is the client's cancellation, not a server error: no ERROR status)"),
     Group((sc.SLOW_CAUSE, *sc.SLOW_SECONDS.values()),
           f"`{sc.SLOW_CAUSE}` and `{sc.SLOW_SECONDS_TEMPLATE.format(cause='<cause>')}` (seconds each cause cost) "
           f"when kept for a cause (see \"Why was it slow?\")"),
     Item(sc.INPUT_MESSAGES, lead="with `capture_content`: "), Item(sc.OUTPUT_MESSAGES),
     *_FEATURES,
     *_lead("TensorRT-LLM only: ", sc.KV_CACHE_REUSED_BLOCKS, sc.KV_CACHE_MISSED_BLOCKS,
            sc.KV_CACHE_ALLOCATED_BLOCKS, sc.KV_CACHE_HIT_RATE, sc.FIRST_ITER, sc.LAST_ITER)),
    shown_name=f"`{{{sc.OPERATION_NAME}}} {{{sc.REQUEST_MODEL}}}` (e.g. `chat llama-3`)")

CHOICE_SPAN = SpanDoc(
    (sc.SPAN_CHOICE,), "INTERNAL",
    f"a kept request that asked for n > 1 choices (`{sc.REQUEST_CHOICE_COUNT}`): one per sequence, "
    "under the request span; the spans below hang under it",
    "the sequence's arrival → the frontend received its last output",
    (Item(sc.CHOICE_INDEX, " (0 … n−1)"), *_when_set(sc.REQUEST_SEED), Item(sc.RESPONSE_FINISH_REASONS),
     Item(sc.USAGE_OUTPUT_TOKENS), Item(sc.LATENCY_TTFT), Item(sc.LATENCY_TPOT), Item(sc.LATENCY_E2E),
     Item(sc.LATENCY_QUEUE), Item(sc.LATENCY_PREFILL), Item(sc.LATENCY_DECODE), Item(sc.NUM_PREEMPTIONS),
     Item(sc.USAGE_CACHE_READ_INPUT_TOKENS), Item(sc.OUTPUT_CHARACTERS), Item(sc.SLO_MET), Item(sc.SLO_BREACHED),
     Item(sc.ERROR_TYPE),
     Group((sc.SLOW_CAUSE, *sc.SLOW_SECONDS.values()),
           f"`{sc.SLOW_CAUSE}` and `{sc.SLOW_SECONDS_TEMPLATE.format(cause='<cause>')}` when kept for a cause"),
     *_FEATURES))

SERVER_SPANS: tuple[SpanDoc, ...] = (
    REQUEST_SPAN,
    CHOICE_SPAN,
    SpanDoc((sc.SPAN_QUEUE,), "INTERNAL", "detail ≥ phases", "arrival → first scheduled",
            (Item(sc.EVENT_ENGINE_QUEUED, " when the engine queued it", event=True),)),
    SpanDoc((sc.SPAN_PREFILL,), "INTERNAL", "detail ≥ phases", "first scheduled → first token",
            (Item(sc.EVENT_PREEMPTION, " for a preemption during prefill", event=True),
             Item(sc.CHUNKS_OMITTED, " when the budget left chunk spans out (the slowest are kept)"))),
    SpanDoc((sc.SPAN_PREFILL_CHUNK,), "INTERNAL", "detail ≥ phases, engine steps on",
            "the engine step that computed the chunk",
            (Item(sc.CHUNK_INDEX), Item(sc.CHUNK_TOKENS),
             Item(sc.ENGINE_STEP_ID, lead=_STEP_FACTS), Item(sc.STEP_DURATION), Item(sc.STEP_BATCH_SIZE),
             Item(sc.STEP_OTHER_PREFILL_TOKENS, " (other requests' prompt tokens in that step)"),
             *_anatomy())),
    SpanDoc((sc.SPAN_DECODE,), "INTERNAL", "detail ≥ phases", "first token → end",
            (Item(sc.EVENT_PREEMPTION, " for a preemption during decode", event=True),
             Item(sc.EVENTFUL_COALESCED, " when the budget put eventful steps into windows"))),
    SpanDoc((sc.SPAN_DECODE_STEP,), "INTERNAL",
            "detail = steps, for an **eventful** decode step (below), or a lone uneventful one between two",
            "previous token → this token",
            (Item(sc.STEP_INDEX), Item(sc.STEP_TOKENS, " (> 1 with speculative decoding)"),
             Item(sc.ENGINE_STEP_ID, lead=_STEP_FACTS), Item(sc.STEP_DURATION), Item(sc.STEP_BATCH_SIZE),
             Item(sc.STEP_OTHER_PREFILL_TOKENS),
             *_anatomy())),
    SpanDoc((sc.SPAN_DECODE_WINDOW,), "INTERNAL", "detail = steps, for each run of uneventful decode steps",
            "first step's previous token → last step's token",
            (Item(sc.WINDOW_TOKENS), Item(sc.WINDOW_FIRST_INDEX, " (decode-step index)"),
             Item(sc.WINDOW_LAST_INDEX, " (decode-step index)"),
             Item(sc.WINDOW_GAP_MEAN, " (seconds per output token)"),
             Item(sc.WINDOW_GAP_MAX, " (longest gap between consecutive outputs, seconds)"))),
    SpanDoc((sc.SPAN_REQUEUE, sc.SPAN_REPREFILL), "INTERNAL", "per preemption, under the phase it hit",
            "preempted → scheduled again → next token"),
    SpanDoc((sc.SPAN_ENGINE_STEP,), "INTERNAL, own trace, own service (`engine_step_service`)",
            "when it produced a chunk or decode-step span of a request kept at full detail (`steps`)",
            "scheduler entered → outputs built (engine clock)",
            (Item(sc.ENGINE_STEP_ID), Item(sc.STEP_PHASE, " (`prefill`/`decode`/`mixed`)"),
             Item(sc.STEP_NUM_PREFILL_REQS), Item(sc.STEP_NUM_PREFILL_TOKENS), Item(sc.STEP_NUM_DECODE_REQS),
             Item(sc.STEP_NUM_DECODE_TOKENS), Item(sc.STEP_BATCH_SIZE), Item(sc.STEP_NUM_RUNNING),
             Item(sc.STEP_NUM_WAITING), Item(sc.STEP_NUM_PREEMPTED), Item(sc.STEP_KV_CACHE_USAGE),
             Item(sc.ENGINE, f" (the engine, e.g. `{sc.PROVIDER_VLLM}`)"),
             Item(sc.SAMPLING_REASON, " (`served_kept_request`)"),
             Item(sc.STEP_QUEUE_BLOCKED, " (why requests stayed waiting after its scheduling, when some did)"),
             *_lead("its anatomy (seconds, where the engine measured it): ",
                    sc.STEP_SCHEDULE_TIME, sc.STEP_EXECUTE_TIME, sc.STEP_MODEL_TIME, sc.STEP_OUTPUT_TIME,
                    sc.STEP_IDLE_BEFORE),
             *_lead("structured outputs (vLLM, a step with a grammar bitmask): ", sc.STEP_GRAMMAR_TIME,
                    sc.STEP_GRAMMAR_REQUESTS),
             *_lead("its roofline (with a model shape and device peaks): ",
                    sc.STEP_FLOPS, sc.STEP_BYTES, sc.STEP_INTENSITY, sc.STEP_BOUND, sc.STEP_PREDICTED_TIME,
                    sc.STEP_MFU, sc.STEP_MBU, sc.STEP_DEVICE),
             *_lead("the GPU sample nearest it (NVML): ", sc.STEP_GPU_UTILIZATION, sc.STEP_GPU_MEMORY,
                    sc.STEP_GPU_POWER, sc.STEP_GPU_SM_CLOCK, sc.STEP_GPU_THROTTLE),
             *_lead("TensorRT-LLM's iteration stats: ", sc.STEP_LATENCY, sc.STEP_KV_BLOCKS_USED,
                    sc.STEP_KV_BLOCKS_MAX),
             *_lead("vLLM's KV cache: ", sc.STEP_KV_CACHE_DTYPE, sc.STEP_KV_CACHE_BLOCK_SIZE),
             *_lead("speculative decoding (vLLM): ", sc.STEP_SPEC_DRAFTS, sc.STEP_SPEC_DRAFT_TOKENS,
                    sc.STEP_SPEC_ACCEPTED_TOKENS, sc.STEP_SPEC_DRAFT_TIME),
             *_lead("LoRA adapters (vLLM): ", sc.STEP_LORA_ADAPTERS, sc.STEP_LORA_COUNT, sc.STEP_LORA_MAX),
             Item(sc.LORA_EVENT_LOADED, f" per adapter the model runner loaded in the step (`{sc.LORA_NAME}`, "
                  f"`{sc.LORA_ID}`, `{sc.LORA_LOAD_TIME}`)", event=True),
             Item(sc.LORA_EVENT_EVICTED, " per adapter its cache dropped in the step", event=True)),
            tail="**span links** to the kept requests whose chunk or decode-step spans it produced"),
)

CLIENT_SPAN = SpanDoc(
    (), "CLIENT (the `openai` client; its W3C context parents the server's request span)",
    "every chat-completions, completions, responses or embeddings call, sync or async, streamed or not",
    "the call → its response read (a stream: its end, or where the caller stopped reading)",
    (Item(sc.OPERATION_NAME), Item(sc.PROVIDER_NAME, "=`openai`"), Item(sc.REQUEST_MODEL),
     Item(sc.REQUEST_MAX_TOKENS), Item(sc.REQUEST_TEMPERATURE), Item(sc.REQUEST_TOP_P),
     *_when_set(sc.REQUEST_SEED, sc.REQUEST_FREQUENCY_PENALTY, sc.REQUEST_PRESENCE_PENALTY,
                sc.REQUEST_STOP_SEQUENCES, sc.REQUEST_CHOICE_COUNT, sc.REQUEST_ENCODING_FORMATS),
     Item(sc.REQUEST_STREAM), Item(sc.SERVER_ADDRESS), Item(sc.SERVER_PORT),
     Item(sc.RESPONSE_ID), Item(sc.RESPONSE_MODEL), Item(sc.RESPONSE_FINISH_REASONS),
     Item(sc.USAGE_INPUT_TOKENS), Item(sc.USAGE_OUTPUT_TOKENS),
     Item(sc.USAGE_CACHE_READ_INPUT_TOKENS, " (`cached_tokens` of the usage's prompt or input token details)"),
     Item(sc.USAGE_REASONING_OUTPUT_TOKENS, " (`reasoning_tokens` of its completion or output token details)"),
     Item(sc.EMBEDDINGS_DIMENSION_COUNT, " (embeddings)"),
     Item(sc.CLIENT_DURATION), Item(sc.CLIENT_SLO_MET), Item(sc.CLIENT_SLO_BREACHED),
     Item(sc.CLIENT_OUTPUT_CHARACTERS), Item(sc.CLIENT_CHARS_PER_SECOND),
     Item(sc.CLIENT_OUTPUT_KINDS, " (`text`, `tool_call`, `refusal`, `reasoning`, `other`)"),
     Item(sc.CLIENT_STREAM_END, " (`complete`, `closed`, `abandoned`, `error`)", lead="streamed calls: "),
     Item(sc.CLIENT_CHUNKS), Item(sc.RESPONSE_TIME_TO_FIRST_CHUNK, " (the first chunk received)"),
     Item(sc.CLIENT_TIME_TO_FIRST_CONTENT, " (the first chunk carrying generated content)"),
     Item(sc.CLIENT_TIME_PER_OUTPUT_CHUNK), Item(sc.CLIENT_CHUNK_GAP_MAX), Item(sc.CLIENT_CHUNK_GAPS_OVER_SLO),
     Item(sc.CLIENT_TIME_PER_OUTPUT_TOKEN),
     *_lead("with `capture_content`: ", sc.INPUT_MESSAGES, sc.SYSTEM_INSTRUCTIONS, sc.OUTPUT_MESSAGES),
     Item(sc.ERROR_TYPE, " (the exception's class, or the API's in-band error code) and ERROR status")),
    shown_name=f"`{{{sc.OPERATION_NAME}}} {{{sc.REQUEST_MODEL}}}` (e.g. `chat gpt-4o`), client side")

SPANS: tuple[SpanDoc, ...] = (*SERVER_SPANS, CLIENT_SPAN)


def spans_table() -> str:
    """The trace-contract table of docs/trace-contract.md."""
    rows = ["| span | kind | when | start → end | attributes |", "|---|---|---|---|---|"]
    for s in SPANS:
        name = s.shown_name or " / ".join(f"`{n}`" for n in s.names)
        items = ", ".join(i.render() for i in s.items)
        cell = "; ".join(part for part in (items, s.tail) if part)
        rows.append(f"| {name} | {s.kind} | {s.when} | {s.start_end} | {cell} |")
    return "\n".join(rows)
