"""The store's tables: DDL (`SCHEMA_SQL`), column types per table, and a Markdown description (`SCHEMA_DOC`)."""

from __future__ import annotations

from core.store.behaviour import view_ddl
from core.store.tokens import TOKEN_IDS_MACRO

SCHEMA_VERSION = 6  # 2: rollouts.step, calls.attempt and weights_version, samples for training; 3: compact prompts
# (calls.prompt_new_token_ids, the calls_full view and the full_prompt macro); 4: image inputs (blobs, calls.image_hashes);
# 5: request bodies as deltas (calls.request_base/head/tail/new/form, the call_requests view, the full_request and
# rollout_requests macros); 6: calls' token ids as text, one character a token (core/store/tokens.py; the token_ids
# macro). migrate adds columns in place (older rows keep their whole bodies, which the views read as they are) and
# turns older INTEGER[] token columns into text

# (table, [(column, duckdb type, description)], primary key or None). The single source for DDL, writer and docs.
TABLES: list[tuple[str, str, list[tuple[str, str, str]], str | None]] = [
    (
        "meta",
        "Facts about the store file itself.",
        [
            ("key", "VARCHAR", "Name of the fact (`schema_version`, `created_at`)."),
            ("value", "VARCHAR", "Its value, as text."),
        ],
        "key",
    ),
    (
        "runs",
        "One row per run (training, eval or a standalone proxy session).",
        [
            ("run_id", "VARCHAR", "Run id; also the folder name under `FORGETUI_HOME/runs/`."),
            ("created_at", "TIMESTAMP", "When the run was created (UTC)."),
            ("status", "VARCHAR", "`running`, `done`, `failed`, `interrupted`, ..."),
            ("config", "JSON", "The fully resolved run config."),
        ],
        "run_id",
    ),
    (
        "rollouts",
        "One row per rollout: one harness working on one task in its own sandbox.",
        [
            ("rollout_id", "VARCHAR", "Rollout id."),
            ("run_id", "VARCHAR", "The run it belongs to (`runs.run_id`)."),
            ("env", "VARCHAR", "Environment name (e.g. `claw-bench`)."),
            ("task_id", "VARCHAR", "Task id inside the environment."),
            ("harness", "VARCHAR", "Harness name (e.g. `codex`, `react`)."),
            ("sample_index", "INTEGER", "Index of this rollout inside its task's group (0..n-1)."),
            ("step", "INTEGER", "Training step whose batch this rollout belongs to (0 for an eval run)."),
            (
                "status",
                "VARCHAR",
                "`pending`, `starting`, `running`, `verifying`, `done`, `failed`, `timeout`, `infra_error`.",
            ),
            ("reward", "DOUBLE", "Verifier score in [0, 1]."),
            ("passed", "BOOLEAN", "Whether the score reached the environment's threshold."),
            ("started_at", "TIMESTAMP", "When the rollout's sandbox started, after its image was built or found (UTC); the build is `meta.timings.build_s`."),
            ("ended_at", "TIMESTAMP", "End of verification or failure (UTC)."),
            ("error", "VARCHAR", "What went wrong, for failed/timeout/infra_error rollouts."),
            ("token", "VARCHAR", "Rollout token the harness uses in the proxy URL (`/r/{token}/...`)."),
            ("attempt", "INTEGER", "Attempt number (infrastructure retries start a new attempt)."),
            ("harness_version", "VARCHAR", "Version of the harness binary/package."),
            ("image_digest", "VARCHAR", "The image this rollout ran in (a task's own image, not the run's shared one): its tag and content id (`tag@sha256:…`); a shared harness volume is `meta.harness_volume`."),
            ("tool_schema_hash", "VARCHAR", "Hash of the tool schemas the harness sent."),
            ("env_version", "VARCHAR", "Version of the environment package."),
            ("task_hash", "VARCHAR", "Content hash of the task (instruction, files, verifier)."),
            ("meta", "JSON", "Anything else (free-form)."),
        ],
        "rollout_id",
    ),
    (
        "calls",
        "One row per model call the proxy served, token-exact.",
        [
            ("call_id", "VARCHAR", "Call id."),
            ("rollout_id", "VARCHAR", "The rollout that made it (`rollouts.rollout_id`)."),
            ("seq", "INTEGER", "Order of the call inside its rollout attempt (0, 1, ...)."),
            ("attempt", "INTEGER", "The rollout's attempt that made it (an infrastructure retry starts again at seq 0)."),
            ("api", "VARCHAR", "Wire protocol: `chat`, `responses`, `messages` or `gemini`."),
            ("model", "VARCHAR", "Model name the harness asked for."),
            (
                "request",
                "JSON",
                "The request body as the harness sent it; NULL when it is stored as a delta (`request_base`): read "
                "whole bodies from `calls_full`, `call_requests`, `rollout_requests(rollout_id)` or `full_request(call_id)`.",
            ),
            ("response", "JSON", "The response body as returned (streams: the assembled final body)."),
            (
                "prompt_token_ids",
                "VARCHAR",
                "Token ids of the rendered prompt, as token text (one character a token: `token_ids(prompt_token_ids)` "
                "gives INTEGER[], `len()` counts them); NULL when the prompt is stored compactly (`prompt_new_token_ids`): "
                "read whole prompts as INTEGER[] from `calls_full` or `full_prompt(call_id)`.",
            ),
            ("completion_token_ids", "VARCHAR", "Token ids the policy sampled, as token text (`token_ids(...)` gives INTEGER[])."),
            ("completion_logprobs", "DOUBLE[]", "Log-probability of each sampled token."),
            ("finish_reason", "VARCHAR", "`stop`, `length`, `tool_calls`, ..."),
            ("status", "VARCHAR", "`ok`, `error` or `cancelled`."),
            ("error", "VARCHAR", "Error message when status is not `ok`."),
            ("started_at", "TIMESTAMP", "When the request arrived (UTC)."),
            ("latency_ms", "DOUBLE", "Time from request to last byte, in ms."),
            ("ttft_ms", "DOUBLE", "Time to first token, in ms (streams)."),
            ("branch", "INTEGER", "Branch number inside the rollout (a new one when the prefix breaks)."),
            ("parent_call_id", "VARCHAR", "The call whose prompt + completion this call's prompt extends."),
            ("extends_parent", "BOOLEAN", "Whether the prompt starts token-exactly with the parent's sequence."),
            ("prefix_tokens", "INTEGER", "How many leading prompt tokens were spliced from earlier calls."),
            ("tool_parse_error", "VARCHAR", "Why tool calls could not be parsed from the sampled text, if so."),
            ("backend", "VARCHAR", "Backend that served it (`builtin:tiny`, `scripted:…`, `vllm:…`, `litellm:…`)."),
            ("stream", "BOOLEAN", "Whether the harness asked for a stream."),
            ("weights_version", "INTEGER", "Version of the policy's weights that sampled it (0 = as loaded; +1 per update)."),
            (
                "prompt_new_token_ids",
                "VARCHAR",
                "Compact prompt (token text): set (and `prompt_token_ids` NULL) when the prompt is the parent's (`parent_call_id`) "
                "prompt + completion, `prefix_tokens` ids in all, followed by these ids.",
            ),
            (
                "image_hashes",
                "VARCHAR[]",
                "Content hashes (`blobs.sha256`) of the request's images, in order; the recorded `request` holds "
                "`\"forgetui_blob\": \"sha256:…\"` where each image's bytes were.",
            ),
            (
                "request_base",
                "VARCHAR",
                "Delta-stored request: the call whose request body this one is spliced on (an earlier call of the "
                "rollout, or the first call of an earlier rollout, stored whole); NULL when `request` holds the whole body.",
            ),
            ("request_head", "INTEGER", "Delta: how many leading characters of the base body this body starts with."),
            ("request_tail", "INTEGER", "Delta: how many trailing characters of the base body this body ends with."),
            ("request_new", "VARCHAR", "Delta: the characters between them (what this body adds or changes)."),
            (
                "request_form",
                "VARCHAR",
                "How the body is stored: `delta`, `whole` (the first of its rollout, or under 1 KB), or whole with the "
                "reason it could not be a delta: `whole:diverged` (re-ordered or rewritten history: a splice on any "
                "recent body would not save half), `whole:not_json` (the `request` column refuses such a body: the "
                "row is kept in `store_errors`), `whole:deep` (its chain reached 1,000 deltas). NULL before schema 5.",
            ),
        ],
        "call_id",
    ),
    (
        "blobs",
        "Image inputs, stored once per content hash: a screenshot a harness resends in every later call's history is one row.",
        [
            ("sha256", "VARCHAR", "sha256 of the bytes (hex)."),
            ("media_type", "VARCHAR", "`image/png`, `image/jpeg`, `image/gif` or `image/webp` (checked against the bytes)."),
            ("bytes", "INTEGER", "Size of `data`."),
            ("data", "BLOB", "The image as sent, decoded from base64."),
            ("first_call_id", "VARCHAR", "The call that first sent it."),
            ("created_at", "TIMESTAMP", "When it was first stored (UTC)."),
        ],
        "sha256",
    ),
    (
        "samples",
        "Training samples built from calls: one per rollout branch (calls whose prompt extends the previous call's prompt + completion merge).",
        [
            ("sample_id", "VARCHAR", "Sample id (`{rollout_id}#{branch}`)."),
            ("run_id", "VARCHAR", "Run id."),
            ("rollout_id", "VARCHAR", "Rollout id."),
            ("task_id", "VARCHAR", "Task id (with `step`, the GRPO group)."),
            ("branch", "INTEGER", "Branch of the rollout this sample covers."),
            ("step", "INTEGER", "Training step whose rollouts produced it."),
            ("token_ids", "INTEGER[]", "The merged token sequence: first prompt, then each call's completion and the next call's new prompt tokens."),
            ("loss_mask", "TINYINT[]", "1 for tokens the model sampled, 0 for tokens the harness, tools or template inserted."),
            ("logprobs", "DOUBLE[]", "Sampling log-probabilities (0 where the mask is 0)."),
            ("prompt_tokens", "INTEGER", "Tokens before the first sampled token (the first call's prompt)."),
            ("call_ids", "VARCHAR[]", "The merged calls, in order."),
            ("completion_starts", "INTEGER[]", "Offset in `token_ids` where each merged call's completion starts (its prompt is everything before)."),
            ("completion_ends", "INTEGER[]", "Offset in `token_ids` just past each merged call's completion."),
            ("weights_version", "INTEGER", "Policy weights version that sampled the calls (the first call's, when they differ)."),
            ("reward", "DOUBLE", "The rollout's reward (shared by every branch)."),
            ("advantage", "DOUBLE", "Advantage used in training (0 for a group whose rewards are all equal)."),
            ("n_calls", "INTEGER", "How many calls were merged into this sample."),
            ("created_at", "TIMESTAMP", "When it was built (UTC)."),
        ],
        "sample_id",
    ),
    (
        "train_steps",
        "One row per optimizer step.",
        [
            ("run_id", "VARCHAR", "Run id."),
            ("step", "INTEGER", "Step number."),
            ("created_at", "TIMESTAMP", "When the step finished (UTC)."),
            ("loss", "DOUBLE", "Training loss."),
            ("reward_mean", "DOUBLE", "Mean reward of the step's rollouts."),
            ("metrics", "JSON", "Other metrics (kl, grad norm, lr, ...)."),
        ],
        None,
    ),
    (
        "store_errors",
        "Rows the writer could not store as given, kept as JSON so nothing is lost silently (a row not even JSON can hold goes to `dead_letters`, as bytes).",
        [
            ("at", "TIMESTAMP", "When the write failed (UTC)."),
            ("table_name", "VARCHAR", "Table the row was meant for."),
            ("row", "JSON", "The row as given."),
            ("error", "VARCHAR", "DuckDB's error message."),
        ],
        None,
    ),
    (
        "dead_letters",
        "Rows that could not be stored even in `store_errors` (e.g. JSON nested deeper than a JSON encoder takes): their bytes, which the store never parses, so taking them cannot fail. `SELECT * FROM store_problems` counts these and `store_errors`; `forgetui sql` warns when either holds rows.",
        [
            ("at", "TIMESTAMP", "When the write failed (UTC)."),
            ("table_name", "VARCHAR", "Table the row was meant for."),
            ("row_key", "VARCHAR", "The row's primary key value (e.g. its `call_id`), when it has one."),
            ("raw", "BLOB", "The whole row as JSON bytes, written without a depth limit (read with `decode(raw)`)."),
            ("error", "VARCHAR", "Why the row and its `store_errors` entry failed."),
        ],
        None,
    ),
]

# (name, description, DDL): views and macros over the tables, created (or replaced) on every open after the tables.
VIEWS: list[tuple[str, str, str]] = [
    (
        "token_ids",
        "Macro: `token_ids(completion_token_ids)` reads a token column (token text, one character a token) as INTEGER[].",
        TOKEN_IDS_MACRO,
    ),
    (
        "full_prompt",
        "Table macro: `SELECT prompt_token_ids FROM full_prompt('call-id')` rebuilds one call's whole prompt (INTEGER[]) "
        "by walking up its parents only (NULL when the chain is broken).",
        """CREATE OR REPLACE MACRO full_prompt(id) AS TABLE
WITH RECURSIVE up(call_id, depth) AS (
    SELECT call_id, 0 FROM calls WHERE call_id = id
    UNION ALL
    SELECT c.parent_call_id, up.depth + 1 FROM up JOIN calls c ON c.call_id = up.call_id
    WHERE c.prompt_token_ids IS NULL AND c.prompt_new_token_ids IS NOT NULL AND up.depth < 1000000
), parts AS (
    SELECT up.depth, c.prompt_token_ids IS NOT NULL AS is_root, c.prefix_tokens,
           coalesce(c.prompt_token_ids, c.prompt_new_token_ids)
           || CASE WHEN up.depth > 0 THEN coalesce(c.completion_token_ids, '') ELSE '' END AS part
    FROM up JOIN calls c ON c.call_id = up.call_id
), checked AS (
    SELECT *, is_root OR prefix_tokens = coalesce(sum(len(part)) OVER (
        ORDER BY depth DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS fits
    FROM parts
)
SELECT id AS call_id,
       CASE WHEN arg_max(is_root, depth) AND bool_and(fits) THEN token_ids(string_agg(part, '' ORDER BY depth DESC)) END AS prompt_token_ids
FROM checked;""",
    ),
    (
        "call_requests",
        "Every call's request body exactly as the harness sent it (`call_id`, `request`): whole bodies as stored, "
        "delta-stored ones rebuilt along their bases (missing where a base row is missing). Rebuilds every body of "
        "the store on every query: for one rollout use `rollout_requests`, for one call `full_request`.",
        """CREATE OR REPLACE VIEW call_requests AS
WITH RECURSIVE deltas AS MATERIALIZED (
    SELECT call_id, request_base, request_head, request_tail, request_new FROM calls WHERE request_base IS NOT NULL
), bodies(call_id, body) AS (
    SELECT call_id, request::VARCHAR FROM calls WHERE request_base IS NULL
    UNION ALL
    SELECT d.call_id, substring(b.body, 1, d.request_head) || d.request_new || right(b.body, d.request_tail)
    FROM bodies b JOIN deltas d ON d.request_base = b.call_id
)
SELECT call_id, body::JSON AS request FROM bodies;""",
    ),
    (
        "rollout_requests",
        "Table macro: `SELECT call_id, request FROM rollout_requests('rollout-id')` gives the request bodies of "
        "one rollout's calls (every attempt), rebuilt from its own rows and the bases they name (NULL where one is missing).",
        """CREATE OR REPLACE MACRO rollout_requests(rid) AS TABLE
WITH RECURSIVE mine AS MATERIALIZED (
    SELECT call_id, rollout_id, request, request_base, request_head, request_tail, request_new FROM calls
    WHERE rollout_id = rid OR call_id IN (SELECT request_base FROM calls WHERE rollout_id = rid)
), bodies(call_id, body) AS (
    SELECT call_id, request::VARCHAR FROM mine WHERE request_base IS NULL
    UNION ALL
    SELECT d.call_id, substring(b.body, 1, d.request_head) || d.request_new || right(b.body, d.request_tail)
    FROM bodies b JOIN mine d ON d.request_base = b.call_id
)
SELECT m.call_id, b.body::JSON AS request FROM mine m LEFT JOIN bodies b ON b.call_id = m.call_id WHERE m.rollout_id = rid;""",
    ),
    (
        "full_request",
        "Table macro: `SELECT request FROM full_request('call-id')` rebuilds one call's request body (through its "
        "rollout's rows; NULL when a base row is missing).",
        """CREATE OR REPLACE MACRO full_request(id) AS TABLE
SELECT id AS call_id, (SELECT request FROM rollout_requests((SELECT rollout_id FROM calls WHERE call_id = id)) r
                       WHERE r.call_id = id) AS request;""",
    ),
    (
        "calls_full",
        "Every `calls` row with its token columns as INTEGER[], its whole prompt in `prompt_token_ids` (compact "
        "prompts rebuilt along their parents; NULL where a parent row is missing or its length disagrees with "
        "`prefix_tokens`) and its whole body in `request` (from `call_requests`). Rebuilds every prompt and body of "
        "the store on every query: for a few calls use `full_prompt` and `full_request`.",
        """CREATE OR REPLACE VIEW calls_full AS
WITH RECURSIVE prompts(call_id, ids, completion) AS (
    SELECT call_id, prompt_token_ids, completion_token_ids FROM calls WHERE prompt_token_ids IS NOT NULL
    UNION ALL
    SELECT c.call_id, p.ids || coalesce(p.completion, '') || c.prompt_new_token_ids, c.completion_token_ids
    FROM prompts p JOIN calls c ON c.parent_call_id = p.call_id
    WHERE c.prompt_token_ids IS NULL AND c.prompt_new_token_ids IS NOT NULL
      AND len(p.ids) + coalesce(len(p.completion), 0) = c.prefix_tokens
)
SELECT c.* REPLACE (token_ids(coalesce(c.prompt_token_ids, p.ids)) AS prompt_token_ids,
                    token_ids(c.prompt_new_token_ids) AS prompt_new_token_ids,
                    token_ids(c.completion_token_ids) AS completion_token_ids, coalesce(c.request, r.request) AS request)
FROM calls c LEFT JOIN prompts p ON p.call_id = c.call_id AND c.prompt_token_ids IS NULL
LEFT JOIN call_requests r ON r.call_id = c.call_id AND c.request_base IS NOT NULL;""",
    ),
    (
        "store_problems",
        "How many rows the writer could not store as given: `store_errors` (kept as JSON) and `dead_letters` (kept as bytes); "
        "both 0 in a healthy store.",
        """CREATE OR REPLACE VIEW store_problems AS
SELECT 'store_errors' AS kept_in, count(*) AS rows FROM store_errors
UNION ALL SELECT 'dead_letters', count(*) FROM dead_letters;""",
    ),
]

# tool uses and results, per-rollout behaviour metrics and their aggregates: not stored in the file (see
# core/store/behaviour.py); queries through core.store.query get them as TEMP views
BEHAVIOUR_VIEWS = view_ddl()

COLUMNS: dict[str, dict[str, str]] = {name: {c: t for c, t, _ in cols} for name, _, cols, _ in TABLES}
PRIMARY_KEYS: dict[str, str | None] = {name: pk for name, _, _, pk in TABLES}
# Keys no index backs (from schema 6): these tables are written only by the writer's keyed upserts (an UPDATE by the
# key, then an INSERT when it matched nothing), so their keys stay unique without one, and they hold few rows, so a
# keyed UPDATE scans little. DuckDB gives each index at least a block of its own: three of them were a quarter of a
# short proxy session's store. `calls`, `samples` and `blobs` keep theirs (inserted, or many rows).
UNINDEXED_KEYS = frozenset({"meta", "runs", "rollouts"})
JSON_COLUMNS: dict[str, frozenset[str]] = {
    name: frozenset(c for c, t in cols.items() if t == "JSON") for name, cols in COLUMNS.items()
}
TIMESTAMP_COLUMNS: dict[str, frozenset[str]] = {
    name: frozenset(c for c, t in cols.items() if t == "TIMESTAMP") for name, cols in COLUMNS.items()
}


# Token id columns, stored as token text (core/store/tokens.py): the writer encodes them, readers decode them.
TOKEN_COLUMNS: dict[str, frozenset[str]] = {"calls": frozenset({"prompt_token_ids", "prompt_new_token_ids", "completion_token_ids"})}
# Columns compressed with zstd rather than DuckDB's default for strings (dictionary/FSST, chosen per segment): a
# request body is tens of KB of JSON that FSST barely shrinks and zstd takes to a fifth; token text repeats as the
# text it encodes does (zstd: about half a byte a token on harness histories, against ~1.9-4.2 bytes as INTEGER[], store_scale.py).
ZSTD_COLUMNS: dict[str, frozenset[str]] = {"calls": frozenset({"request", "request_new", "response"}) | TOKEN_COLUMNS["calls"]}


def column_sql(table: str, column: str, sql_type: str) -> str:
    """A column's type in DDL, with its compression where it has one."""
    return f"{sql_type} USING COMPRESSION zstd" if column in ZSTD_COLUMNS.get(table, ()) else sql_type


def q(name: str) -> str:
    """Quote an identifier (some column names, like `at`, are SQL keywords)."""
    return '"' + name.replace('"', '""') + '"'


def _ddl(name: str, cols: list[tuple[str, str, str]], pk: str | None) -> str:
    pk = None if name in UNINDEXED_KEYS else pk
    lines = [f"    {q(c)} {column_sql(name, c, t)}{' PRIMARY KEY' if c == pk else ''}" for c, t, _ in cols]
    return f"CREATE TABLE IF NOT EXISTS {name} (\n" + ",\n".join(lines) + "\n);"


SCHEMA_SQL = "\n".join(_ddl(name, cols, pk) for name, _, cols, pk in TABLES)
VIEWS_SQL = "\n".join(ddl for _, _, ddl in VIEWS)


def _doc() -> str:
    parts = [f"Schema version {SCHEMA_VERSION}. Timestamps are UTC; JSON columns hold JSON text.\n"]
    for name, about, cols, pk in TABLES:
        key = f" Key: `{pk}` (unique; no index: written by keyed upserts only)." if name in UNINDEXED_KEYS else f" Primary key: `{pk}`."
        parts.append(f"### `{name}`\n\n{about}" + (key if pk else "") + "\n")
        parts.append("| column | type | meaning |\n|---|---|---|")
        parts.extend(f"| `{c}` | {t} | {d} |" for c, t, d in cols)
        parts.append("")
    parts.append(
        "### Views and macros\n\nA call whose prompt extends its parent's prompt + completion is stored compactly: "
        "`prompt_token_ids` NULL, `prompt_new_token_ids` the ids after the parent's. A request body that repeats an "
        "earlier one (harnesses resend their whole history) is stored as a splice on it: `request` NULL, the base's "
        "first `request_head` and last `request_tail` characters around `request_new` (`core/store/bodies.py`; "
        "Python readers rebuild them with its `select_calls`/`request_of`, faster than these views). These rebuild "
        "whole prompts and bodies, byte for byte:\n"
    )
    parts.extend(f"- `{name}`: {about}" for name, about, _ in VIEWS)
    parts.append(
        "\n#### Behaviour views\n\nWhat agents do, from the recorded wire bodies of every protocol (definitions in "
        "`core/store/behaviour.py`; `forgetui analyze` and `forgetui compare` read them). They are not stored in the "
        "file: every query through `forgetui sql`, the TUI or a writer's live endpoint that names one gets it as a "
        "TEMP view (a DuckDB client of its own can run `core.store.behaviour.with_views(sql)`):\n"
    )
    parts.extend(f"- `{name}`: {about}" for name, about, _ in BEHAVIOUR_VIEWS)
    parts.append("")
    return "\n".join(parts)


SCHEMA_DOC = _doc()
