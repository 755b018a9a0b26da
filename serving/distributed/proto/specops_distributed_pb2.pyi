from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("model", "vocab_size", "max_block", "max_sessions", "idle_timeout_s", "max_batch", "active_sessions")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_block: int
    max_sessions: int
    idle_timeout_s: float
    max_batch: int
    active_sessions: int
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_block: _Optional[int] = ..., max_sessions: _Optional[int] = ..., idle_timeout_s: _Optional[float] = ..., max_batch: _Optional[int] = ..., active_sessions: _Optional[int] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class StartRequest(_message.Message):
    __slots__ = ("prompt_token_ids", "sampling", "max_new_tokens", "server_drafter", "policy", "k")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SERVER_DRAFTER_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: Sampling
    max_new_tokens: int
    server_drafter: str
    policy: str
    k: int
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., server_drafter: _Optional[str] = ..., policy: _Optional[str] = ..., k: _Optional[int] = ...) -> None: ...

class StartReply(_message.Message):
    __slots__ = ("session_id", "fused")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FUSED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    fused: bool
    def __init__(self, session_id: _Optional[str] = ..., fused: _Optional[bool] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "draft_token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., draft_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("session_id", "proposed", "accepted", "new_token_ids", "target_token_id", "emitted_token_ids", "finished", "stop_reason", "pass_s", "pass_sessions", "pass_rows")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EMITTED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    PASS_S_FIELD_NUMBER: _ClassVar[int]
    PASS_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PASS_ROWS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    proposed: int
    accepted: int
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    target_token_id: int
    emitted_token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    stop_reason: str
    pass_s: float
    pass_sessions: int
    pass_rows: int
    def __init__(self, session_id: _Optional[str] = ..., proposed: _Optional[int] = ..., accepted: _Optional[int] = ..., new_token_ids: _Optional[_Iterable[int]] = ..., target_token_id: _Optional[int] = ..., emitted_token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ..., stop_reason: _Optional[str] = ..., pass_s: _Optional[float] = ..., pass_sessions: _Optional[int] = ..., pass_rows: _Optional[int] = ...) -> None: ...

class VerifyReply(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: StepReply
    def __init__(self, step: _Optional[_Union[StepReply, _Mapping]] = ...) -> None: ...

class VerifyBatchRequest(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[VerifyRequest]
    def __init__(self, blocks: _Optional[_Iterable[_Union[VerifyRequest, _Mapping]]] = ...) -> None: ...

class VerifyBatchReply(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepReply]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepReply, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class FinalizeRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class FinalizeReply(_message.Message):
    __slots__ = ("output_token_ids", "stop_reason", "steps", "draft_tokens", "accepted_tokens", "prefill_s")
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop_reason: str
    steps: int
    draft_tokens: int
    accepted_tokens: int
    prefill_s: float
    def __init__(self, output_token_ids: _Optional[_Iterable[int]] = ..., stop_reason: _Optional[str] = ..., steps: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., prefill_s: _Optional[float] = ...) -> None: ...
