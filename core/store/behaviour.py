"""The behaviour views: tool uses and results in canonical form, per-rollout metrics and their aggregates, in SQL.

Each view reads the recorded wire bodies (`calls.request` / `calls.response`) of all four protocols, so
users can query and extend them with `forgetui sql`. They are not stored in the file (their definitions
take ~115 KB of DuckDB's catalog, more than a short session's whole record): every read-only query names
them as it likes, and `create_temp_views` (run by `core.store.readonly.execute_read_only`, which every
`forgetui sql`, TUI and live-endpoint query goes through) makes the ones it names TEMP views of its
connection first; `with_views(sql)` inlines them all as CTEs instead. Stores before schema 6 kept them
in the file; these definitions replace those for the queries here.
"""

from __future__ import annotations

import re
from typing import Any

from core.status import SCORED_SQL
from core.store.tool_classes import values_sql

# A tool result counts as failed when the protocol flags it (Messages `is_error`, a Gemini `error` field) or its
# text (first 2000 chars) shows a non-zero exit code, a Python traceback, or starts with "error"/"exception".
ERROR_RE = (
    r"(?i)(exit(ed)?( with)? code:? *-?[1-9]|exit status:? *-?[1-9]|<returncode>\s*-?[1-9]|"
    r"\"(exit_code|returncode|exitcode)\": *-?[1-9]|traceback \(most recent call last\)|^\s*(error|exception)\b)"
)
# A shell command writes when, once harmless redirections are dropped (2>&1, >/dev/null, ->, =>, >=),
# it still redirects output (>, >>), or runs tee, sed -i, or a command that changes files.
SHELL_IGNORE_RE = r"[0-9]*>&[0-9-]+|&?[0-9]*>>? *(/dev/null|/dev/stderr|/dev/stdout)|->|=>|>=|<<<"
SHELL_WRITE_RE = (
    r">|\btee\b|\bsed\s+(-[a-zA-Z]+\s+)*-[a-zA-Z]*i|"
    r"\b(mv|cp|rm|touch|mkdir|rmdir|ln|install|chmod|truncate|patch|unzip|rsync)\s"
)
# What a tool result's text is, whatever the protocol put there: a string, a list of text parts, or a JSON object.
_TEXT_OF = (
    "CASE json_type({b}) WHEN 'VARCHAR' THEN {b}->>'$' "
    "WHEN 'ARRAY' THEN array_to_string(json_extract_string({b}, '$[*].text'), chr(10)) ELSE {b}::VARCHAR END"
)
_PROMPT_LEN = (
    "coalesce(len(prompt_token_ids), prefix_tokens + len(prompt_new_token_ids), "
    "TRY_CAST(response->>'$.usage.prompt_tokens' AS INTEGER), TRY_CAST(response->>'$.usage.input_tokens' AS INTEGER), "
    "TRY_CAST(response->>'$.usageMetadata.promptTokenCount' AS INTEGER))"
)
_SAMPLED_LEN = (
    "coalesce(len(completion_token_ids), TRY_CAST(response->>'$.usage.completion_tokens' AS INTEGER), "
    "TRY_CAST(response->>'$.usage.output_tokens' AS INTEGER), TRY_CAST(response->>'$.usageMetadata.candidatesTokenCount' AS INTEGER))"
)

# (name, description, SELECT body), in dependency order.
BEHAVIOUR_VIEWS: list[tuple[str, str, str]] = [
    (
        "tool_classes",
        "The tool classification table (`harness`, `tool`, `class`): each harness's tool names → `shell`, `read`, "
        "`write`, `search`, `browse`, `plan` or `other`; rows with harness `*` are the fallback by lower-cased name "
        "(`core/analytics/tools.py`). A tool in neither is `unknown`.",
        values_sql(),
    ),
    (
        "final_calls",
        "The `calls` of each rollout's final attempt (the one its score belongs to), request bodies whole (those "
        "stored as deltas rebuilt): what every behaviour view reads.",
        # `stored` gives an older store (no delta columns) the same columns, NULL; the rebuild is `call_requests`'s
        """WITH RECURSIVE stored AS (
    SELECT * FROM calls UNION ALL BY NAME SELECT NULL::VARCHAR AS request_base, NULL::INTEGER AS request_head,
        NULL::INTEGER AS request_tail, NULL::VARCHAR AS request_new WHERE false
), bodies(call_id, body) AS (
    SELECT call_id, request::VARCHAR FROM stored
    WHERE request_base IS NULL AND call_id IN (SELECT request_base FROM stored WHERE request_base IS NOT NULL)
    UNION ALL
    SELECT d.call_id, substring(b.body, 1, d.request_head) || d.request_new || right(b.body, d.request_tail)
    FROM bodies b JOIN stored d ON d.request_base = b.call_id
)
SELECT c.* REPLACE (coalesce(c.request, b.body::JSON) AS request)
FROM stored c JOIN rollouts r ON r.rollout_id = c.rollout_id
LEFT JOIN bodies b ON b.call_id = c.call_id AND c.request_base IS NOT NULL
WHERE coalesce(c.attempt, 0) = coalesce(r.attempt, 0)""",
    ),
    (
        "offered_tools",
        "One row per distinct tool a rollout's harness offered on any call (`rollout_id`, `tool`, `class`).",
        """WITH named AS (
    SELECT rollout_id, unnest(CASE api
        WHEN 'chat' THEN json_extract_string(request, '$.tools[*].function.name')
        WHEN 'gemini' THEN json_extract_string(request, '$.tools[*].functionDeclarations[*].name')
        ELSE json_extract_string(request, '$.tools[*].name') END) AS tool
    FROM final_calls
)
SELECT DISTINCT n.rollout_id, n.tool, coalesce(h.class, g.class, 'unknown') AS class
FROM named n JOIN rollouts r ON r.rollout_id = n.rollout_id
LEFT JOIN tool_classes h ON h.harness = r.harness AND h.tool = n.tool
LEFT JOIN tool_classes g ON g.harness = '*' AND g.tool = lower(n.tool)
WHERE n.tool IS NOT NULL""",
    ),
    (
        "tool_uses",
        "One row per tool call the model made (from each call's response, in canonical form): `rollout_id`, "
        "`call_id`, `seq`, `branch`, `idx` (its place in the answer), `pos` (`seq` * 1000 + `idx`: the order inside "
        "the rollout), `tool_id`, `tool`, `class`, `arguments` (JSON text) and `writes` (a `write` tool, or a "
        "`shell` command that redirects output, runs tee, `sed -i`, mv, cp, rm, touch, mkdir...).",
        f"""WITH raw AS (
    SELECT rollout_id, call_id, seq, branch, api, CASE api
        WHEN 'chat' THEN json_extract(response, '$.choices[0].message.tool_calls[*]')
        WHEN 'responses' THEN json_extract(response, '$.output[*]')
        WHEN 'messages' THEN json_extract(response, '$.content[*]')
        WHEN 'gemini' THEN json_extract(response, '$.candidates[0].content.parts[*]') END AS items
    FROM final_calls WHERE response IS NOT NULL
), items AS (
    SELECT rollout_id, call_id, seq, branch, api, unnest(range(len(items))) AS idx, unnest(items) AS item FROM raw
), parsed AS (
    SELECT rollout_id, call_id, seq, branch, idx,
        CASE api WHEN 'chat' THEN (item->>'$.id') WHEN 'responses' THEN (item->>'$.call_id') WHEN 'messages' THEN (item->>'$.id')
            ELSE coalesce(item->>'$.functionCall.id', (item->>'$.functionCall.name')) END AS tool_id,
        CASE api WHEN 'chat' THEN (item->>'$.function.name') WHEN 'gemini' THEN (item->>'$.functionCall.name')
            ELSE (item->>'$.name') END AS tool,
        CASE api WHEN 'chat' THEN (item->>'$.function.arguments')
            WHEN 'responses' THEN coalesce(item->>'$.arguments', (item->>'$.input'))
            WHEN 'messages' THEN (item->'$.input')::VARCHAR ELSE (item->'$.functionCall.args')::VARCHAR END AS arguments
    FROM items
    WHERE (api = 'chat')
       OR (api = 'responses' AND (item->>'$.type') IN ('function_call', 'custom_tool_call', 'local_shell_call'))
       OR (api = 'messages' AND (item->>'$.type') = 'tool_use')
       OR (api = 'gemini' AND (item->'$.functionCall') IS NOT NULL)
), classed AS (
    SELECT p.*, r.harness, coalesce(h.class, g.class, 'unknown') AS class,
        CASE WHEN json_valid(p.arguments) AND json_type(p.arguments::JSON) = 'OBJECT'
             THEN array_to_string(json_extract_string(p.arguments, '$.*'), ' ') ELSE p.arguments END AS argument_text
    FROM parsed p JOIN rollouts r ON r.rollout_id = p.rollout_id
    LEFT JOIN tool_classes h ON h.harness = r.harness AND h.tool = p.tool
    LEFT JOIN tool_classes g ON g.harness = '*' AND g.tool = lower(p.tool)
)
SELECT rollout_id, call_id, seq, branch, idx, seq * 1000 + idx AS pos, tool_id, tool, class, arguments,
    class = 'write' OR (class = 'shell' AND coalesce(regexp_matches(
        regexp_replace(argument_text, '{SHELL_IGNORE_RE}', ' ', 'g'), '{SHELL_WRITE_RE}'), false)) AS writes
FROM classed""",
    ),
    (
        "tool_results",
        "One row per tool result the harness sent back (found in later requests, first sighting kept): "
        "`rollout_id`, `tool_id`, `seq` (the call whose request first carried it), `result` (text), `failed` "
        "(the protocol flags an error, or the text shows a non-zero exit code, a traceback, or starts with "
        "`error`/`exception`: `core/store/behaviour.py` ERROR_RE).",
        f"""WITH raw AS (
    SELECT rollout_id, seq, api, CASE api
        WHEN 'chat' THEN json_extract(request, '$.messages[*]')
        WHEN 'responses' THEN json_extract(request, '$.input[*]')
        WHEN 'messages' THEN json_extract(request, '$.messages[*].content[*]')
        WHEN 'gemini' THEN json_extract(request, '$.contents[*].parts[*]') END AS items
    FROM final_calls
), items AS (
    SELECT rollout_id, seq, api, unnest(items) AS item FROM raw
), parsed AS (
    SELECT rollout_id, seq,
        CASE api WHEN 'chat' THEN (item->>'$.tool_call_id') WHEN 'responses' THEN (item->>'$.call_id')
            WHEN 'messages' THEN (item->>'$.tool_use_id')
            ELSE coalesce(item->>'$.functionResponse.id', (item->>'$.functionResponse.name')) END AS tool_id,
        CASE api WHEN 'chat' THEN (item->'$.content') WHEN 'responses' THEN (item->'$.output')
            WHEN 'messages' THEN (item->'$.content') ELSE (item->'$.functionResponse.response') END AS body,
        CASE api WHEN 'messages' THEN coalesce(TRY_CAST(item->>'$.is_error' AS BOOLEAN), false)
            WHEN 'gemini' THEN (item->'$.functionResponse.response.error') IS NOT NULL ELSE false END AS flagged
    FROM items
    WHERE (api = 'chat' AND (item->>'$.role') = 'tool')
       OR (api = 'responses' AND (item->>'$.type') IN ('function_call_output', 'custom_tool_call_output', 'local_shell_call_output'))
       OR (api = 'messages' AND (item->>'$.type') = 'tool_result')
       OR (api = 'gemini' AND (item->'$.functionResponse') IS NOT NULL)
), texts AS (
    SELECT rollout_id, seq, tool_id, flagged, {_TEXT_OF.format(b="body")} AS result FROM parsed WHERE tool_id IS NOT NULL
), firsts AS (
    SELECT rollout_id, tool_id, min(seq) AS seq, arg_min(result, seq) AS result, bool_or(flagged) AS flagged
    FROM texts GROUP BY rollout_id, tool_id
)
SELECT rollout_id, tool_id, seq, result,
    flagged OR coalesce(regexp_matches(left(result, 2000), '{ERROR_RE.replace("'", "''")}'), false) AS failed
FROM firsts""",
    ),
    (
        "rollout_behaviour",
        "One row per rollout with its behaviour metrics: `model` (the run's `policy.backend`; `none` under oracle/noop), `status`, `reward`, "
        "`passed`; tool coverage (`classes_offered`, `classes_used`, `coverage` = used / offered among known "
        "classes, `tool_calls`, `unknown_tool_calls`, `malformed_calls`: calls with a `tool_parse_error`); "
        "self-verification (`wrote`: any write, `verified`: a later non-writing `shell`, `read` or `search` call "
        "after the last write, NULL without writes); error recovery (`failed_tool_calls`, `had_tool_error`, "
        "`recovered`: a failed result and the rollout still passed); plan completion (`checks`, `checks_met`, "
        "`plan_completion` = met / checks from `meta.checks`, NULL under 2 checks); effort (`turns` = calls, "
        "`sampled_tokens`, `prompt_tokens` summed over calls, `wall_s`, `context_growth` = (last prompt − first "
        "prompt) / (turns − 1), `branches` = distinct `calls.branch`).",
        f"""WITH effort AS (
    SELECT rollout_id, count(*) AS turns, sum({_SAMPLED_LEN}) AS sampled_tokens, sum({_PROMPT_LEN}) AS prompt_tokens,
        arg_min({_PROMPT_LEN}, seq) AS first_prompt, arg_max({_PROMPT_LEN}, seq) AS last_prompt,
        count(DISTINCT branch) AS branches, count(tool_parse_error) AS malformed_calls
    FROM final_calls GROUP BY rollout_id
), steps AS (
    SELECT u.*, coalesce(res.failed, false) AS failed FROM tool_uses u
    LEFT JOIN tool_results res ON res.rollout_id = u.rollout_id AND res.tool_id = u.tool_id
), uses AS (
    SELECT rollout_id, count(*) AS tool_calls, count(*) FILTER (WHERE class = 'unknown') AS unknown_tool_calls,
        count(DISTINCT class) FILTER (WHERE class <> 'unknown') AS classes_used,
        max(pos) FILTER (WHERE writes) AS last_write, count(*) FILTER (WHERE failed) AS failed_tool_calls
    FROM steps GROUP BY rollout_id
), checked AS (
    SELECT s.rollout_id, bool_or(s.pos > u.last_write AND NOT s.writes AND s.class IN ('shell', 'read', 'search')) AS verified
    FROM steps s JOIN uses u ON u.rollout_id = s.rollout_id WHERE u.last_write IS NOT NULL GROUP BY s.rollout_id
), offered AS (
    SELECT rollout_id, count(DISTINCT class) FILTER (WHERE class <> 'unknown') AS classes_offered FROM offered_tools GROUP BY rollout_id
), checks AS (
    SELECT rollout_id, len(scores) AS checks,
        list_count(list_filter(scores, lambda x: TRY_CAST(x AS DOUBLE) >= 1.0)) AS checks_met
    FROM (SELECT rollout_id, json_extract_string(meta, '$.checks.*') AS scores FROM rollouts)
)
SELECT r.run_id, r.rollout_id, r.env, r.task_id, r.harness,
    -- the reference harnesses call no model: such a run evaluates none (core.proxy.no_model), whatever policy.backend says
    CASE WHEN r.harness IN ('oracle', 'noop') THEN 'none' ELSE coalesce((ru.config->>'$.policy.backend'), '') END AS model,
    coalesce(r.step, 0) AS step, r.sample_index, r.status, r.reward, r.passed,
    coalesce(o.classes_offered, 0) AS classes_offered, coalesce(u.classes_used, 0) AS classes_used,
    CASE WHEN coalesce(o.classes_offered, 0) > 0 THEN coalesce(u.classes_used, 0) / o.classes_offered END AS coverage,
    coalesce(u.tool_calls, 0) AS tool_calls, coalesce(u.unknown_tool_calls, 0) AS unknown_tool_calls,
    coalesce(e.malformed_calls, 0) AS malformed_calls,
    u.last_write IS NOT NULL AS wrote, CASE WHEN u.last_write IS NOT NULL THEN coalesce(k.verified, false) END AS verified,
    coalesce(u.failed_tool_calls, 0) AS failed_tool_calls, coalesce(u.failed_tool_calls, 0) > 0 AS had_tool_error,
    coalesce(u.failed_tool_calls, 0) > 0 AND coalesce(r.passed, false) AS recovered,
    coalesce(c.checks, 0) AS checks, coalesce(c.checks_met, 0) AS checks_met,
    CASE WHEN c.checks >= 2 THEN c.checks_met / c.checks END AS plan_completion,
    coalesce(e.turns, 0) AS turns, coalesce(e.sampled_tokens, 0) AS sampled_tokens, coalesce(e.prompt_tokens, 0) AS prompt_tokens,
    epoch(r.ended_at - r.started_at) AS wall_s,
    CASE WHEN e.turns > 1 THEN (e.last_prompt - e.first_prompt) / (e.turns - 1) END AS context_growth,
    coalesce(e.branches, 0) AS branches
FROM rollouts r LEFT JOIN runs ru ON ru.run_id = r.run_id
LEFT JOIN effort e ON e.rollout_id = r.rollout_id LEFT JOIN uses u ON u.rollout_id = r.rollout_id
LEFT JOIN checked k ON k.rollout_id = r.rollout_id LEFT JOIN offered o ON o.rollout_id = r.rollout_id
LEFT JOIN checks c ON c.rollout_id = r.rollout_id""",
    ),
    (
        "tool_usage",
        "Calls per tool: one row per run × harness × tool (`class`, `calls`, `rollouts` using it, `failed` results).",
        """SELECT r.run_id, r.harness, u.tool, u.class, count(*) AS calls, count(DISTINCT u.rollout_id) AS rollouts,
    count(*) FILTER (WHERE res.failed) AS failed
FROM tool_uses u JOIN rollouts r ON r.rollout_id = u.rollout_id
LEFT JOIN tool_results res ON res.rollout_id = u.rollout_id AND res.tool_id = u.tool_id
GROUP BY ALL""",
    ),
    (
        "behaviour_summary",
        "`rollout_behaviour` aggregated per run × env × harness × model × step over scored rollouts (infra errors "
        "and unfinished ones left out): `rollouts`, `pass_rate`, `mean_reward`, `coverage`, `tool_calls`, "
        "`malformed_calls` (means per rollout), `verify_rate` (share of rollouts that wrote and then verified), "
        "`tool_error_rollouts`, `recovery_rate` (share of those that still passed), `plan_completion`, and mean "
        "`turns`, `sampled_tokens`, `prompt_tokens`, `wall_s`, `context_growth`, `branches`.",
        """SELECT run_id, env, harness, model, step, count(*) AS rollouts, avg(passed::INTEGER) AS pass_rate,
    avg(reward) AS mean_reward, avg(coverage) AS coverage, avg(tool_calls) AS tool_calls,
    avg(malformed_calls) AS malformed_calls, avg(verified::INTEGER) AS verify_rate,
    count(*) FILTER (WHERE had_tool_error) AS tool_error_rollouts,
    avg(recovered::INTEGER) FILTER (WHERE had_tool_error) AS recovery_rate, avg(plan_completion) AS plan_completion,
    avg(turns) AS turns, avg(sampled_tokens) AS sampled_tokens, avg(prompt_tokens) AS prompt_tokens,
    avg(wall_s) AS wall_s, avg(context_growth) AS context_growth, avg(branches) AS branches
FROM rollout_behaviour WHERE status IN """ + SCORED_SQL + """
GROUP BY ALL""",
    ),
]

VIEW_NAMES = tuple(name for name, _, _ in BEHAVIOUR_VIEWS)
_NAMED = {name: re.compile(rf"\b{name}\b", re.IGNORECASE) for name in VIEW_NAMES}
_AS_CTE = {name: re.compile(rf"\b{name}\s+AS\s*(NOT\s+)?(MATERIALIZED\s*)?\(", re.IGNORECASE) for name in VIEW_NAMES}
# what each view reads of the others (its definition names them)
_READS = {name: [other for other in VIEW_NAMES[:i] if _NAMED[other].search(body)] for i, (name, _, body) in enumerate(BEHAVIOUR_VIEWS)}


def views_named(sql: str) -> list[str]:
    """The behaviour views `sql` reads (those it names and what they read, in dependency order); a name the query
    defines itself as a CTE (e.g. `with_views`) is not one."""
    wanted = {n for n in VIEW_NAMES if _NAMED[n].search(sql) and not _AS_CTE[n].search(sql)}
    for name in reversed(VIEW_NAMES):  # dependencies come earlier in VIEW_NAMES
        if name in wanted:
            wanted.update(_READS[name])
    return [n for n in VIEW_NAMES if n in wanted]


def create_temp_views(cur: Any, sql: str) -> list[str]:
    """Make the behaviour views `sql` reads TEMP views of `cur`'s connection (over its `calls`/`rollouts`); their names."""
    names = views_named(sql)
    bodies = {name: body for name, _, body in BEHAVIOUR_VIEWS}
    for name in names:
        cur.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS\n{bodies[name]}")
    return names


def view_ddl() -> list[tuple[str, str, str]]:
    """(name, description, CREATE OR REPLACE VIEW statement) for `core.store.schema.VIEWS`."""
    return [
        (name, about, f"CREATE OR REPLACE VIEW {name} AS\n{body};") for name, about, body in BEHAVIOUR_VIEWS
    ]


def with_views(sql: str) -> str:
    """`sql` with every behaviour view inlined as a CTE (works on stores that predate them, read-only too)."""
    ctes = ",\n".join(f"{name} AS (\n{body}\n)" for name, _, body in BEHAVIOUR_VIEWS)
    return f"WITH {ctes}\n{sql}"
