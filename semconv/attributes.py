"""Attribute and event names, one constant each, grouped by the convention that defines them.

Pinned to the versions in ``version.py``. Deprecated names stay here as long as real emitters
send them; each group says where its names come from. Our own enrichment keys live in the
``agentfunnel.*`` namespace at the end.
"""

from typing import Final

# --- OpenTelemetry GenAI (semantic-conventions v1.41.0, and the GenAI registry after the move)
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"  # deprecated in v1.37 for gen_ai.provider.name
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_VERSION: Final = "gen_ai.agent.version"  # the agent's version (slicing); else service.version
GEN_AI_WORKFLOW_NAME: Final = "gen_ai.workflow.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"  # before v1.27
GEN_AI_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"  # before v1.27
GEN_AI_AGGREGATED_INPUT_TOKENS: Final = "gen_ai.aggregated_usage.input_tokens"  # Pydantic AI totals
GEN_AI_AGGREGATED_OUTPUT_TOKENS: Final = "gen_ai.aggregated_usage.output_tokens"
GEN_AI_PROMPT: Final = "gen_ai.prompt"  # before v1.28, and OpenLLMetry's indexed gen_ai.prompt.<i>.*
GEN_AI_COMPLETION: Final = "gen_ai.completion"
GEN_AI_TOOL_STATUS: Final = "gen_ai.tool.status"  # Strands
ERROR_TYPE: Final = "error.type"

OP_CHAT = ("chat", "text_completion", "generate_content")
OP_TOOL = ("execute_tool",)
OP_AGENT = ("invoke_agent", "create_agent", "invoke_workflow")

# --- events (span events or log records with event_name)
EVENT_EXCEPTION: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EVENT_TOOL_MESSAGE: Final = "gen_ai.tool.message"
EVENT_CHOICE: Final = "gen_ai.choice"
EVENT_OPERATION_DETAILS: Final = "gen_ai.client.inference.operation.details"
EVENT_EVALUATION_RESULT: Final = "gen_ai.evaluation.result"
EVENT_OPERATION_EXCEPTION: Final = "gen_ai.client.operation.exception"  # v1.41

# --- MCP (semantic-conventions v1.39+)
MCP_METHOD_NAME: Final = "mcp.method.name"
MCP_SESSION_ID: Final = "mcp.session.id"
MCP_PROTOCOL_METHODS = ("initialize", "ping", "tools/list", "prompts/list", "resources/list",
                        "resources/templates/list", "server/discover", "logging/setLevel", "roots/list",
                        "completion/complete")

# --- OpenInference (openinference-semantic-conventions 0.1.42)
OI_SPAN_KIND: Final = "openinference.span.kind"
OI_SESSION_ID: Final = "session.id"
OI_USER_ID: Final = "user.id"
OI_AGENT_NAME: Final = "agent.name"
OI_TOOL_NAME: Final = "tool.name"
OI_TOOL_ID: Final = "tool.id"
OI_INPUT_VALUE: Final = "input.value"
OI_OUTPUT_VALUE: Final = "output.value"
OI_LLM_MODEL_NAME: Final = "llm.model_name"
OI_LLM_RESPONSE_MODEL_NAME: Final = "llm.response.model_name"
OI_LLM_TOKEN_PROMPT: Final = "llm.token_count.prompt"
OI_LLM_TOKEN_COMPLETION: Final = "llm.token_count.completion"
OI_LLM_FINISH_REASON: Final = "llm.finish_reason"
OI_LLM_OUTPUT_MESSAGES: Final = "llm.output_messages"

# --- OpenLLMetry / Traceloop (opentelemetry-semantic-conventions-ai 0.5.1)
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
TRACELOOP_ENTITY_NAME: Final = "traceloop.entity.name"
TRACELOOP_ENTITY_INPUT: Final = "traceloop.entity.input"
TRACELOOP_ENTITY_OUTPUT: Final = "traceloop.entity.output"
TRACELOOP_WORKFLOW_NAME: Final = "traceloop.workflow.name"
TRACELOOP_ASSOCIATION: Final = "traceloop.association.properties."
LLM_REQUEST_TYPE: Final = "llm.request.type"

# --- Vercel AI SDK (ai 3.x–6.x telemetry; v7 emits GenAI names)
AI_OPERATION_ID: Final = "ai.operationId"
AI_TOOLCALL_NAME: Final = "ai.toolCall.name"
AI_TOOLCALL_ID: Final = "ai.toolCall.id"
AI_TOOLCALL_ARGS: Final = "ai.toolCall.args"
AI_TOOLCALL_RESULT: Final = "ai.toolCall.result"
AI_MODEL_ID: Final = "ai.model.id"
AI_RESPONSE_MODEL: Final = "ai.response.model"
AI_RESPONSE_TEXT: Final = "ai.response.text"
AI_RESPONSE_FINISH_REASON: Final = "ai.response.finishReason"
AI_FUNCTION_ID: Final = "ai.telemetry.functionId"
AI_METADATA: Final = "ai.telemetry.metadata."
AI_USAGE_INPUT: Final = ("ai.usage.inputTokens", "ai.usage.promptTokens")
AI_USAGE_OUTPUT: Final = ("ai.usage.outputTokens", "ai.usage.completionTokens")

# --- Langfuse SDK attributes
LANGFUSE_SESSION_ID: Final = "langfuse.session.id"
LANGFUSE_USER_ID: Final = "langfuse.user.id"
LANGFUSE_OBSERVATION_TYPE: Final = "langfuse.observation.type"
LANGFUSE_OBSERVATION_INPUT: Final = "langfuse.observation.input"
LANGFUSE_OBSERVATION_OUTPUT: Final = "langfuse.observation.output"
LANGFUSE_OBSERVATION_LEVEL: Final = "langfuse.observation.level"
LANGFUSE_OBSERVATION_MODEL: Final = "langfuse.observation.model.name"
LANGFUSE_USAGE_DETAILS: Final = "langfuse.observation.usage_details"
LANGFUSE_TRACE_OUTPUT: Final = "langfuse.trace.output"
LANGFUSE_TRACE_METADATA_SESSION: Final = "langfuse.trace.metadata.langfuse_session_id"

# --- Pydantic AI / Logfire
LOGFIRE_SPAN_TYPE: Final = "logfire.span_type"
PYDANTIC_FINAL_RESULT: Final = "final_result"
PYDANTIC_TOOL_FAILURE_STAGE: Final = "pydantic_ai.tool.failure_stage"

# --- Google ADK
ADK_SESSION_ID: Final = "gcp.vertex.agent.session_id"
ADK_TOOL_ARGS: Final = "gcp.vertex.agent.tool_call_args"
ADK_TOOL_RESPONSE: Final = "gcp.vertex.agent.tool_response"

# --- where a session id may be, in precedence order (SPEC §3; semconv.md §4)
SESSION_KEYS: Final = (
    GEN_AI_CONVERSATION_ID,
    OI_SESSION_ID,
    LANGFUSE_SESSION_ID,
    TRACELOOP_ASSOCIATION + "session_id",
    TRACELOOP_ASSOCIATION + "conversation_id",
    TRACELOOP_ASSOCIATION + "thread_id",
    AI_METADATA + "sessionId",
    "ai.settings.context.sessionId",
    LANGFUSE_TRACE_METADATA_SESSION,
    ADK_SESSION_ID,
)
WEAK_SESSION_KEYS: Final = (MCP_SESSION_ID,)  # a transport session, used only when nothing else is there
USER_KEYS: Final = (OI_USER_ID, LANGFUSE_USER_ID, TRACELOOP_ASSOCIATION + "user_id", AI_METADATA + "userId",
                    "enduser.id")

# --- our own namespace (case attribution; enrichment keys come with the forwarder)
AGENTFUNNEL_CASE_ID: Final = "agentfunnel.case.id"
AGENTFUNNEL_EXPERIMENT: Final = "agentfunnel.experiment"
AGENTFUNNEL_RUN_ID: Final = "agentfunnel.run.id"
AGENTFUNNEL_SERVICES: Final = "agentfunnel.server.services"  # declared commerce services, e.g. dev.ucp.shopping
AGENTFUNNEL_STORE_PAGE: Final = "agentfunnel.store_page"  # a WebMCP run on a store's own page: never pays

# --- the evaluation harness (``agentfunnel eval run``): one span per run it started, in the run's first
# trace, saying how the agent's process ended; read by dialects/harness.py (collector/eval_run.py writes it)
AGENTFUNNEL_HARNESS_SPAN: Final = "agentfunnel.harness.run"  # the span's name
AGENTFUNNEL_HARNESS_OUTCOME: Final = "agentfunnel.harness.outcome"  # ok | crash | timeout | interrupted
AGENTFUNNEL_HARNESS_EXIT_CODE: Final = "agentfunnel.harness.exit_code"  # None when killed at the timeout
AGENTFUNNEL_HARNESS_STDERR_TAIL: Final = "agentfunnel.harness.stderr_tail"  # the last bytes of stderr, bounded
AGENTFUNNEL_HARNESS_TIMEOUT: Final = "agentfunnel.harness.timeout_seconds"
AGENTFUNNEL_HARNESS_MESSAGE: Final = "agentfunnel.harness.message"  # why, in one line
HARNESS_OUTCOMES: Final = ("ok", "crash", "timeout", "interrupted")
