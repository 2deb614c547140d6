/* Per-trace summaries of GenAI-semconv spans, read straight from ExportTraceServiceRequest bytes.
 *
 * The Python path (decode -> semconv.normalize -> scoring.facts' summarize, per trace) is the
 * reference; this walk gives the same states for the traces it can read exactly and hands every
 * other trace back. A span is read here only when each attribute key is one of the GenAI keys
 * below that the caller enabled, one of normalize's user keys, or a key nothing reads (the caller
 * names the keys normalize or another dialect reads); its values have the types read here; it has
 * no events; its scope marks no other dialect; its resource has no agentfunnel.* key. Anything else
 * sends its trace back; anything odd in the bytes (a malformed field, a field given twice, an id the
 * decoder would reject) sends the whole body back, saying why and where. JSON text (tool payloads,
 * messages, tool definitions) is read by the reference's own readers, which the caller passes in.
 * Nothing recurses: the message tree has a fixed depth and nested values are refused.
 *
 * Compiled into the _wire extension (see pyproject.toml); _wire.c lists genai_summaries.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    Py_ssize_t n; /* -1: absent */
} Str;

enum { K_OTHER, K_LLM, K_TOOL, K_AGENT };
enum { V_NONE, V_STR, V_BOOL, V_INT, V_DOUBLE, V_ARRAY };

/* What a key is read as. The role's index is its bit in the caller's enabled mask. */
enum {
    R_OP, R_RESP_MODEL, R_REQ_MODEL, R_PROVIDER, R_SYSTEM, R_IN, R_OUT, R_FINISH, R_TOOL, R_AGENT, R_WORKFLOW,
    R_ERROR, R_ARGUMENTS, R_RESULT, R_INPUT, R_OUTPUT, R_DEFINITIONS, R_CALL_ID, R_RESPONSE_ID, R_CONVERSATION, R_AGENT_ID, R_AGENT_DESC, R_TOOL_DESC, R_TOOL_TYPE,
    R_MAX_TOKENS, R_TEMPERATURE, R_TOP_P, R_SERVER_ADDRESS, R_SERVER_PORT, NROLES
};
static const char *const ROLE_KEYS[NROLES] = {
    "gen_ai.operation.name", "gen_ai.response.model", "gen_ai.request.model", "gen_ai.provider.name",
    "gen_ai.system", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons",
    "gen_ai.tool.name", "gen_ai.agent.name", "gen_ai.workflow.name", "error.type", "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result", "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.definitions",
    "gen_ai.tool.call.id",
    "gen_ai.response.id", "gen_ai.conversation.id", "gen_ai.agent.id", "gen_ai.agent.description",
    "gen_ai.tool.description", "gen_ai.tool.type", "gen_ai.request.max_tokens", "gen_ai.request.temperature",
    "gen_ai.request.top_p", "server.address", "server.port",
};
/* Roles whose value is only passed over (read by nothing a summary holds): any scalar is fine. */
#define FIRST_PASSED R_CALL_ID

#define MAX_ARRAY 64 /* finish reasons a span may list */

typedef struct {
    const uint8_t *tid, *sid, *pid; /* pid NULL: no parent */
    uint64_t start, end;
    Str name, model, tool, agent, workflow, error_type, status_msg, finish, service, arguments, result, user;
    Str input, output, definitions;
    Str version, session, call_id, provider; /* what rows read: the resource's service.version, the session key, ... */
    int weak_session, status_code, genai;
    int kind, extract_kind, status_error, has_in, has_out;
    int setup; /* a create_agent span: a trace of only those is set-up, ignored by the trace rules */
    int64_t in, out;
    uint32_t trace;
} SpanS;

typedef struct {
    const uint8_t *tid;
    int bad; /* handed back to Python */
    size_t nspans;
} TraceS;

typedef struct {
    const uint8_t *start0, *end0, *last; /* last: where the field read last begins (named when the body goes back) */
    SpanS *spans;
    size_t nspans, capspans;
    TraceS *traces;
    size_t ntraces, captraces;
    uint32_t *table; /* open addressing: trace index + 1, 0 empty */
    size_t tablecap;
    const char *why; /* the whole body goes back: why */
    uint32_t enabled;
    PyObject *scopes;
    Str *deny, *deny_prefixes, *mark_keys, *mark_values, *user_keys, *session_keys; /* the caller's tuples of str */
    Py_ssize_t ndeny, ndeny_prefixes, nmarks, nuser_keys, nsession_keys, nstrong;
    Py_ssize_t max_value; /* a string value longer than this (bytes) is cut by the pipeline: its span goes back; 0: none */
} Walk;

/* ---- reading the wire ------------------------------------------------------------------------ */

static int varint(Walk *w, const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    const uint8_t *p = *pp;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end) {
            w->why = "a varint runs past its message";
            return -1;
        }
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    w->why = "a varint is longer than 10 bytes";
    return -1;
}

static int field(Walk *w, const uint8_t **pp, const uint8_t *end, uint32_t *fn, int *wt, const uint8_t **s,
                 size_t *n, uint64_t *v) {
    uint64_t tag;
    w->last = *pp;
    if (varint(w, pp, end, &tag) < 0) return -1;
    if (tag > 0xffffffffu || (tag >> 3) == 0) {
        w->why = "a field number out of range";
        return -1;
    }
    *fn = (uint32_t)(tag >> 3);
    *wt = (int)(tag & 7);
    switch (*wt) {
    case 0:
        return varint(w, pp, end, v);
    case 1:
        if ((size_t)(end - *pp) < 8) break;
        memcpy(v, *pp, 8); /* little-endian hosts only, as _wire.c */
        *pp += 8;
        return 0;
    case 5: {
        uint32_t x;
        if ((size_t)(end - *pp) < 4) break;
        memcpy(&x, *pp, 4);
        *v = x;
        *pp += 4;
        return 0;
    }
    case 2: {
        uint64_t len;
        if (varint(w, pp, end, &len) < 0) return -1;
        if (len > (uint64_t)(end - *pp)) break;
        *s = *pp;
        *n = (size_t)len;
        *pp += len;
        return 0;
    }
    default:
        w->why = "a group or an unknown wire type";
        return -1;
    }
    w->why = "a field runs past its message";
    return -1;
}

/* Each known field of a message once at most: protobuf's merge rules for a repeated singular field are
 * the decoder's to apply. */
static int once(Walk *w, uint32_t *seen, uint32_t fn) {
    if (fn < 32) {
        if (*seen & (1u << fn)) {
            w->why = "a singular field given twice";
            return -1;
        }
        *seen |= 1u << fn;
    }
    return 0;
}

static int expect(Walk *w, int wt, int want) {
    if (wt != want) {
        w->why = "a known field with another wire type";
        return -1;
    }
    return 0;
}

static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

typedef struct {
    int type;
    Str s;
    int64_t i;
    Str last; /* V_ARRAY: its last element (a string), n = -1 when empty */
} Val;

/* An AnyValue of a scalar, or (with arrays) an array of strings. 1: read, 0: a value not read here. */
static int any_value(Walk *w, const uint8_t *p, const uint8_t *end, Val *out, int arrays) {
    uint32_t seen = 0;
    out->type = V_NONE;
    int unread = 0;
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn <= 7 && (once(w, &seen, 1) < 0)) return -1; /* a oneof: one member, once */
        switch (fn) {
        case 1:
            if (expect(w, wt, 2) < 0) return -1;
            if (!utf8_ok(s, n)) {
                w->why = "a string that is not UTF-8";
                return -1;
            }
            out->type = V_STR, out->s.p = s, out->s.n = (Py_ssize_t)n;
            break;
        case 2:
            if (expect(w, wt, 0) < 0) return -1;
            out->type = V_BOOL, out->i = v != 0;
            break;
        case 3:
            if (expect(w, wt, 0) < 0) return -1;
            out->type = V_INT, out->i = (int64_t)v;
            break;
        case 4:
            if (expect(w, wt, 1) < 0) return -1;
            out->type = V_DOUBLE;
            break;
        case 5: {
            if (expect(w, wt, 2) < 0) return -1;
            if (!arrays) {
                unread = 1;
                break;
            }
            out->type = V_ARRAY;
            out->last.n = -1;
            const uint8_t *q = s, *qend = s + n;
            int count = 0;
            while (q < qend) {
                uint32_t afn;
                int awt;
                const uint8_t *as = NULL;
                size_t an = 0;
                uint64_t av = 0;
                if (field(w, &q, qend, &afn, &awt, &as, &an, &av) < 0) return -1;
                if (afn != 1) {
                    unread = 1;
                    continue;
                }
                if (expect(w, awt, 2) < 0) return -1;
                Val e;
                int r = any_value(w, as, as + an, &e, 0);
                if (r < 0) return -1;
                if (!r || e.type != V_STR || ++count > MAX_ARRAY) unread = 1;
                else out->last = e.s;
            }
            break;
        }
        case 6: case 7:
            if (expect(w, wt, 2) < 0) return -1;
            unread = 1;
            break;
        default:
            break; /* an unknown field: passed over */
        }
    }
    return !unread;
}

static int key_is(const uint8_t *s, size_t n, const char *key) {
    size_t k = strlen(key);
    return n == k && memcmp(s, key, k) == 0;
}

static int role_of(const uint8_t *s, size_t n) {
    for (int r = 0; r < NROLES; r++)
        if (key_is(s, n, ROLE_KEYS[r])) return r;
    return -1;
}

/* Resource attributes: service.name and user.id read; our own agentfunnel.* keys (read by normalize)
 * refused; any other scalar passed over. 1: usable, 0: its spans go back. */
static int resource(Walk *w, const uint8_t *p, const uint8_t *end, Str *service, Str *user, Str *version) {
    uint32_t seen = 0;
    int usable = 1, named = 0, users = 0, versions = 0;
    service->n = user->n = version->n = -1;
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn != 1) {
            if (fn <= 3 && once(w, &seen, fn) < 0) return -1;
            if (fn == 3) usable = 0; /* entity refs: not read here */
            continue;
        }
        if (expect(w, wt, 2) < 0) return -1;
        const uint8_t *q = s, *qend = s + n, *key = NULL;
        size_t keyn = 0;
        Val val = {V_NONE};
        int read = 1;
        uint32_t kseen = 0;
        while (q < qend) {
            uint32_t kfn;
            int kwt;
            const uint8_t *ks = NULL;
            size_t kn = 0;
            uint64_t kv = 0;
            if (field(w, &q, qend, &kfn, &kwt, &ks, &kn, &kv) < 0) return -1;
            if (kfn == 1 || kfn == 2) {
                if (once(w, &kseen, kfn) < 0 || expect(w, kwt, 2) < 0) return -1;
                if (kfn == 1) {
                    if (!utf8_ok(ks, kn)) {
                        w->why = "a key that is not UTF-8";
                        return -1;
                    }
                    key = ks, keyn = kn;
                } else {
                    int r = any_value(w, ks, ks + kn, &val, 0);
                    if (r < 0) return -1;
                    read = r;
                }
            }
        }
        if (!read || !key || (keyn >= 12 && memcmp(key, "agentfunnel.", 12) == 0)) {
            usable = 0;
        } else if (key_is(key, keyn, "user.id")) { /* the user when no span attribute names one */
            if (users++ || (val.type != V_STR && val.type != V_NONE)) usable = 0;
            else if (val.type == V_STR) *user = val.s;
        } else if (key_is(key, keyn, "service.name")) {
            if (named++ || (val.type != V_STR && val.type != V_NONE)) usable = 0;
            else if (val.type == V_STR) *service = val.s;
        } else if (key_is(key, keyn, "service.version")) { /* the agent's version when no span names one */
            if (versions++ || (val.type != V_STR && val.type != V_NONE)) usable = 0;
            else if (val.type == V_STR) *version = val.s;
        }
    }
    return usable;
}

/* ---- traces ---------------------------------------------------------------------------------- */

#define MAX_PROBES 64 /* trace ids colliding past this in the walk's table: the body goes back (bounded work) */

static uint64_t fmix64(uint64_t h) {
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* Every bit of both halves reaches the low bits the table uses (ids that differ in their last bytes, such
 * as counters, spread as random ones do); the seed differs from process to process. */
static uint64_t id_hash(const uint8_t *t) {
    static uint64_t seed;
    if (!seed) seed = fmix64((uint64_t)(uintptr_t)&seed ^ (uint64_t)(uintptr_t)t ^ 0x9e3779b97f4a7c15ull) | 1;
    uint64_t a, b;
    memcpy(&a, t, 8);
    memcpy(&b, t + 8, 8);
    return fmix64(a ^ fmix64(b ^ seed));
}

static int grow_table(Walk *w) {
    size_t cap = w->tablecap ? w->tablecap * 2 : 64;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; i < w->ntraces; i++) {
        size_t h = id_hash(w->traces[i].tid) & (cap - 1);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = (uint32_t)i + 1;
    }
    free(w->table);
    w->table = t;
    w->tablecap = cap;
    return 0;
}

static long trace_of(Walk *w, const uint8_t *tid) {
    if ((w->ntraces + 1) * 2 > w->tablecap && grow_table(w) < 0) return -1;
    size_t h = id_hash(tid) & (w->tablecap - 1), probes = 0;
    while (w->table[h]) {
        uint32_t i = w->table[h] - 1;
        if (memcmp(w->traces[i].tid, tid, 16) == 0) return i;
        h = (h + 1) & (w->tablecap - 1);
        if (++probes > MAX_PROBES) {
            w->why = "trace ids colliding in the walk's table";
            return -2;
        }
    }
    if (w->ntraces == w->captraces) {
        size_t cap = w->captraces ? w->captraces * 2 : 16;
        TraceS *t = realloc(w->traces, cap * sizeof *t);
        if (!t) return -1;
        w->traces = t;
        w->captraces = cap;
    }
    TraceS *t = &w->traces[w->ntraces];
    t->tid = tid, t->bad = 0, t->nspans = 0;
    w->table[h] = (uint32_t)w->ntraces + 1;
    return (long)w->ntraces++;
}

static int all_zero(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i]) return 0;
    return 1;
}

static int is_space(uint8_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); }

/* semconv.dialects.base.after_prefix; a name with bytes past ASCII is not stripped here (-2: go back). */
static int after_prefix(Str name, const char *prefix, Str *out) {
    size_t k = strlen(prefix);
    if (name.n < 0 || (size_t)name.n <= k || memcmp(name.p, prefix, k) != 0) return 0;
    const uint8_t *s = name.p + k, *e = name.p + name.n;
    for (const uint8_t *q = s; q < e; q++)
        if (*q >= 0x80) return -2;
    while (s < e && is_space(*s)) s++;
    while (e > s && is_space(e[-1])) e--;
    if (s == e) return 0;
    out->p = s, out->n = e - s;
    return 1;
}

static int str_eq(Str a, const char *b) { return a.n >= 0 && key_is(a.p, (size_t)a.n, b); }
static int truthy(Str s) { return s.n > 0; }

static int same(Str a, const uint8_t *s, size_t n) { return (size_t)a.n == n && memcmp(a.p, s, n) == 0; }

/* A key read by normalize or by another dialect (exactly or by prefix): its span's trace goes back. */
static Py_ssize_t user_key(const Walk *w, const uint8_t *key, size_t n) {
    for (Py_ssize_t i = 0; i < w->nuser_keys; i++)
        if (same(w->user_keys[i], key, n)) return i;
    return -1;
}

static Py_ssize_t session_key(const Walk *w, const uint8_t *key, size_t n) {
    for (Py_ssize_t i = 0; i < w->nsession_keys; i++)
        if (same(w->session_keys[i], key, n)) return i;
    return -1;
}

static int passable(const Walk *w, const uint8_t *key, size_t n) {
    for (Py_ssize_t i = 0; i < w->ndeny; i++)
        if (same(w->deny[i], key, n)) return 0;
    for (Py_ssize_t i = 0; i < w->ndeny_prefixes; i++) {
        Str p = w->deny_prefixes[i];
        if ((size_t)p.n <= n && memcmp(p.p, key, (size_t)p.n) == 0) return 0;
    }
    return 1;
}

/* A (key, value) another dialect is recognised by. */
static int marked(const Walk *w, const uint8_t *key, size_t n, const Val *v) {
    if (v->type != V_STR) return 0;
    for (Py_ssize_t i = 0; i < w->nmarks; i++)
        if (same(w->mark_keys[i], key, n) && same(w->mark_values[i], v->s.p, (size_t)v->s.n)) return 1;
    return 0;
}

/* A span, read. 1: read; 0: its trace goes back; -1: the body goes back. */
static int span(Walk *w, const uint8_t *p, const uint8_t *end, SpanS *sp) {
    uint32_t seen = 0;
    Str tid = {NULL, -1}, sid = {NULL, -1}, pid = {NULL, -1};
    Val vals[NROLES];
    int has[NROLES] = {0}, usable = 1, genai = 0;
    Py_ssize_t user_at = -1;
    uint64_t users_seen = 0;
    uint64_t kind = 0, code = 0;
    memset(sp, 0, sizeof *sp);
    Str none = {NULL, -1};
    sp->name = sp->model = sp->tool = sp->agent = sp->workflow = sp->error_type = sp->status_msg = sp->finish = none;
    sp->arguments = sp->result = sp->user = sp->input = sp->output = sp->definitions = none;
    sp->version = sp->session = sp->call_id = sp->provider = none;
    Py_ssize_t session_at = -1;
    uint64_t sessions_seen = 0;
    sp->name.p = (const uint8_t *)"", sp->name.n = 0;
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn <= 16 && fn != 9 && fn != 11 && fn != 13 && once(w, &seen, fn) < 0) return -1;
        switch (fn) {
        case 1: case 2: case 3: case 4: case 5:
            if (expect(w, wt, 2) < 0) return -1;
            if (fn == 1) tid.p = s, tid.n = (Py_ssize_t)n;
            else if (fn == 2) sid.p = s, sid.n = (Py_ssize_t)n;
            else if (fn == 4) pid.p = s, pid.n = (Py_ssize_t)n;
            else if (fn == 5) sp->name.p = s, sp->name.n = (Py_ssize_t)n;
            if ((fn == 3 || fn == 5) && !utf8_ok(s, n)) {
                w->why = "a string that is not UTF-8";
                return -1;
            }
            break;
        case 6:
            if (expect(w, wt, 0) < 0) return -1;
            kind = v;
            break;
        case 7: case 8:
            if (expect(w, wt, 1) < 0) return -1;
            if (v > (uint64_t)INT64_MAX) usable = 0;
            if (fn == 7) sp->start = v;
            else sp->end = v;
            break;
        case 9: {
            if (expect(w, wt, 2) < 0) return -1;
            const uint8_t *q = s, *qend = s + n, *key = NULL;
            size_t keyn = 0;
            uint32_t kseen = 0;
            Val val = {V_NONE};
            int read = 1;
            while (q < qend) {
                uint32_t kfn;
                int kwt;
                const uint8_t *ks = NULL;
                size_t kn = 0;
                uint64_t kv = 0;
                if (field(w, &q, qend, &kfn, &kwt, &ks, &kn, &kv) < 0) return -1;
                if (kfn != 1 && kfn != 2) continue;
                if (once(w, &kseen, kfn) < 0 || expect(w, kwt, 2) < 0) return -1;
                if (kfn == 1) {
                    if (!utf8_ok(ks, kn)) {
                        w->why = "a key that is not UTF-8";
                        return -1;
                    }
                    key = ks, keyn = kn;
                } else {
                    int r = any_value(w, ks, ks + kn, &val, 1);
                    if (r < 0) return -1;
                    read = r;
                }
            }
            int role = key ? role_of(key, keyn) : -1;
            if (w->max_value > 0 && ((val.type == V_STR && val.s.n > w->max_value) ||
                                     (val.type == V_ARRAY && val.last.n > w->max_value)))
                usable = 0; /* the stage reads it cut (receivers.max_attribute_value_bytes) */
            Py_ssize_t u = key ? user_key(w, key, keyn) : -1, k = key ? session_key(w, key, keyn) : -1;
            if (k >= 0) { /* normalize's session key: the first with a value, in the keys' order (and read as
                           * whatever else the key is, below) */
                if (k >= 64 || (sessions_seen >> k & 1) || (val.type != V_STR && val.type != V_NONE)) usable = 0;
                else sessions_seen |= 1ull << k;
                if (val.type == V_STR && val.s.n > 0 && (session_at < 0 || k < session_at))
                    session_at = k, sp->session = val.s;
            }
            if (!key || !read || marked(w, key, keyn, &val)) {
                usable = 0;
            } else if (u >= 0) { /* normalize's user: the first user key with a value, in the keys' order */
                if (u >= 64 || (users_seen >> u & 1) || (val.type != V_STR && val.type != V_NONE)) usable = 0;
                else users_seen |= 1ull << u;
                if (val.type == V_STR && val.s.n > 0 && (user_at < 0 || u < user_at)) user_at = u, sp->user = val.s;
            } else if (role >= 0) { /* read, when enabled */
                if (!(w->enabled & (1u << role)) || has[role]) usable = 0;
                has[role] = 1;
                vals[role] = val;
            } else if (!passable(w, key, keyn)) {
                usable = 0;
            }
            if (keyn >= 7 && memcmp(key, "gen_ai.", 7) == 0) genai = 1;
            break;
        }
        case 11:
            if (expect(w, wt, 2) < 0) return -1;
            usable = 0; /* events: read in Python */
            break;
        case 13: case 10: case 12: case 14: case 16:
            break; /* links, dropped counts, flags: no record field */
        case 15: {
            if (expect(w, wt, 2) < 0) return -1;
            const uint8_t *q = s, *qend = s + n;
            uint32_t sseen = 0;
            while (q < qend) {
                uint32_t sfn;
                int swt;
                const uint8_t *ss = NULL;
                size_t sn = 0;
                uint64_t sv = 0;
                if (field(w, &q, qend, &sfn, &swt, &ss, &sn, &sv) < 0) return -1;
                if (sfn == 2) {
                    if (once(w, &sseen, 2) < 0 || expect(w, swt, 2) < 0) return -1;
                    if (!utf8_ok(ss, sn)) {
                        w->why = "a string that is not UTF-8";
                        return -1;
                    }
                    sp->status_msg.p = ss, sp->status_msg.n = (Py_ssize_t)sn;
                } else if (sfn == 3) {
                    if (once(w, &sseen, 3) < 0 || expect(w, swt, 0) < 0) return -1;
                    code = sv;
                }
            }
            break;
        }
        default:
            break;
        }
    }
    /* what the decoder rejects, or reads otherwise: the whole body goes back */
    if (tid.n != 16 || all_zero(tid.p, 16) || sid.n != 8 || all_zero(sid.p, 8) || (pid.n > 0 && pid.n != 8) ||
        (uint32_t)kind > 5 || (uint32_t)code > 2) {
        w->why = "a span the decoder rejects";
        return -1;
    }
    sp->tid = tid.p, sp->sid = sid.p;
    sp->pid = pid.n == 8 && !all_zero(pid.p, 8) ? pid.p : NULL;
    sp->status_error = (uint32_t)code == 2;
    sp->status_code = (int)code;
    sp->weak_session = session_at >= w->nstrong;
    if (!usable) return 0;
    for (int r = 0; r < NROLES; r++) {
        if (!has[r]) continue;
        int t = vals[r].type;
        if (r < FIRST_PASSED && r != R_IN && r != R_OUT && r != R_FINISH && t != V_STR) return 0;
        if ((r == R_IN || r == R_OUT) && t != V_INT) return 0;
        if (r == R_FINISH && t != V_STR && t != V_ARRAY) return 0;
        if (r >= FIRST_PASSED && t == V_ARRAY) return 0;
        if (r == R_CALL_ID && t != V_STR) return 0; /* a tool call's id as its row keeps it */
    }
    if (has[R_ERROR]) sp->error_type = vals[R_ERROR].s;
    if (has[R_PROVIDER] && vals[R_PROVIDER].s.n > 0) sp->provider = vals[R_PROVIDER].s;
    else if (has[R_SYSTEM] && vals[R_SYSTEM].s.n > 0) sp->provider = vals[R_SYSTEM].s;
    sp->genai = genai;
    if (!genai) {
        sp->kind = K_OTHER;
        return 1;
    }
    if (has[R_OP]) {
        Str op = vals[R_OP].s;
        if (str_eq(op, "chat") || str_eq(op, "text_completion") || str_eq(op, "generate_content")) sp->kind = K_LLM;
        else if (str_eq(op, "execute_tool")) sp->kind = K_TOOL;
        else if (str_eq(op, "invoke_agent") || str_eq(op, "create_agent") || str_eq(op, "invoke_workflow"))
            sp->kind = K_AGENT, sp->setup = str_eq(op, "create_agent");
        else sp->kind = K_OTHER;
    } else {
        sp->kind = has[R_TOOL] ? K_TOOL : K_OTHER;
    }
    Str model = has[R_RESP_MODEL] && vals[R_RESP_MODEL].s.n > 0 ? vals[R_RESP_MODEL].s
              : has[R_REQ_MODEL] && vals[R_REQ_MODEL].s.n > 0 ? vals[R_REQ_MODEL].s : none;
    if (!str_eq(model, "unknown")) sp->model = model;
    if (has[R_FINISH]) sp->finish = vals[R_FINISH].type == V_ARRAY ? vals[R_FINISH].last : vals[R_FINISH].s;
    if (has[R_INPUT]) sp->input = vals[R_INPUT].s;
    if (has[R_OUTPUT]) sp->output = vals[R_OUTPUT].s;
    if (has[R_DEFINITIONS]) sp->definitions = vals[R_DEFINITIONS].s;
    sp->extract_kind = sp->kind;
    if (sp->kind == K_TOOL) {
        if (has[R_TOOL] && truthy(vals[R_TOOL].s)) sp->tool = vals[R_TOOL].s;
        else if (after_prefix(sp->name, "execute_tool ", &sp->tool) == -2) return 0;
        if (!truthy(sp->tool)) sp->kind = K_OTHER;
        if (has[R_ARGUMENTS]) sp->arguments = vals[R_ARGUMENTS].s;
        if (has[R_RESULT]) sp->result = vals[R_RESULT].s;
        if (has[R_CALL_ID]) sp->call_id = vals[R_CALL_ID].s;
    } else if (sp->kind == K_LLM || sp->kind == K_AGENT) {
        if (has[R_IN]) sp->has_in = 1, sp->in = vals[R_IN].i;
        if (has[R_OUT]) sp->has_out = 1, sp->out = vals[R_OUT].i;
    }
    if (sp->kind == K_AGENT) {
        if (has[R_AGENT] && truthy(vals[R_AGENT].s)) sp->agent = vals[R_AGENT].s;
        else {
            int r = after_prefix(sp->name, "invoke_agent ", &sp->agent);
            if (r == 0) r = after_prefix(sp->name, "create_agent ", &sp->agent);
            if (r == -2) return 0;
        }
        if (has[R_WORKFLOW] && truthy(vals[R_WORKFLOW].s)) sp->workflow = vals[R_WORKFLOW].s;
        else if (after_prefix(sp->name, "invoke_workflow ", &sp->workflow) == -2) return 0;
    }
    return 1;
}

static int scope_marks_another(Walk *w, const uint8_t *s, size_t n) {
    if (!PySet_GET_SIZE(w->scopes)) return 0;
    PyObject *name = PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, NULL);
    if (!name) return -1;
    int r = PySet_Contains(w->scopes, name);
    Py_DECREF(name);
    return r;
}

static int add_span(Walk *w, SpanS *sp, int usable) {
    long t = trace_of(w, sp->tid);
    if (t < 0) return -1;
    w->traces[t].nspans++;
    if (!usable) {
        w->traces[t].bad = 1;
        return 0;
    }
    if (w->nspans == w->capspans) {
        size_t cap = w->capspans ? w->capspans * 2 : 64;
        SpanS *s = realloc(w->spans, cap * sizeof *s);
        if (!s) return -1;
        w->spans = s;
        w->capspans = cap;
    }
    sp->trace = (uint32_t)t;
    w->spans[w->nspans++] = *sp;
    return 0;
}

static int scope_spans(Walk *w, const uint8_t *p0, const uint8_t *end, int res_usable, Str service, Str user,
                       Str version) {
    const uint8_t *p = p0;
    uint32_t seen = 0;
    int usable = res_usable;
    while (p < end) { /* the scope first: it may follow the spans */
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn == 1) {
            if (once(w, &seen, 1) < 0 || expect(w, wt, 2) < 0) return -1;
            const uint8_t *q = s, *qend = s + n;
            uint32_t sseen = 0;
            while (q < qend) {
                uint32_t sfn;
                int swt;
                const uint8_t *ss = NULL;
                size_t sn = 0;
                uint64_t sv = 0;
                if (field(w, &q, qend, &sfn, &swt, &ss, &sn, &sv) < 0) return -1;
                if (sfn > 4) continue;
                if (once(w, &sseen, sfn) < 0) return -1;
                if (sfn == 3) usable = 0; /* scope attributes: not read here */
                if (sfn == 1 || sfn == 2) {
                    if (expect(w, swt, 2) < 0) return -1;
                    if (!utf8_ok(ss, sn)) {
                        w->why = "a string that is not UTF-8";
                        return -1;
                    }
                    if (sfn == 1) {
                        int r = scope_marks_another(w, ss, sn);
                        if (r < 0) return -1;
                        if (r) usable = 0;
                    }
                }
            }
        } else if (fn == 2) {
            if (expect(w, wt, 2) < 0) return -1;
        } else if (fn == 3 && (once(w, &seen, 3) < 0 || expect(w, wt, 2) < 0 || !utf8_ok(s, n))) {
            if (!w->why) w->why = "a string that is not UTF-8";
            return -1;
        }
    }
    p = p0;
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn != 2) continue;
        SpanS sp;
        int r = span(w, s, s + n, &sp);
        if (r < 0) return -1;
        sp.service = service, sp.version = version;
        if (sp.user.n < 0 && user.n > 0) sp.user = user;
        if (add_span(w, &sp, r && usable) < 0) return -1;
    }
    return 0;
}

static int resource_spans(Walk *w, const uint8_t *p0, const uint8_t *end) {
    const uint8_t *p = p0;
    uint32_t seen = 0;
    int usable = 1;
    Str service = {NULL, -1}, user = {NULL, -1}, version = {NULL, -1};
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn == 1) {
            if (once(w, &seen, 1) < 0 || expect(w, wt, 2) < 0) return -1;
            int r = resource(w, s, s + n, &service, &user, &version);
            if (r < 0) return -1;
            usable = r;
        } else if (fn == 2 && expect(w, wt, 2) < 0) {
            return -1;
        } else if (fn == 3 && (once(w, &seen, 3) < 0 || expect(w, wt, 2) < 0 || !utf8_ok(s, n))) {
            if (!w->why) w->why = "a string that is not UTF-8";
            return -1;
        }
    }
    p = p0;
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn == 2 && scope_spans(w, s, s + n, usable, service, user, version) < 0) return -1;
    }
    return 0;
}

static int request(Walk *w, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s = NULL;
        size_t n = 0;
        uint64_t v = 0;
        if (field(w, &p, end, &fn, &wt, &s, &n, &v) < 0) return -1;
        if (fn == 1) {
            if (expect(w, wt, 2) < 0 || resource_spans(w, s, s + n) < 0) return -1;
        }
    }
    return 0;
}

/* ---- states ---------------------------------------------------------------------------------- */

/* What the caller gives: classes and helpers of scoring.facts, in this order. */
enum {
    X_ACTIVITY, X_ANSWERS, X_CALLFACTS, X_CATALOG, X_STARTS, X_EXTENT, X_MODELS, X_REQUESTS, X_ROOTS, X_ROOTFACTS,
    X_SERVICES, X_TOKENS, X_COST, X_ERROR_FACTS, X_BARE, X_AGENTS, X_NOTHING, X_OK_FLAGS, X_OK_PAYMENT, X_SERVERS,
    X_FINISH_MAP, X_PAYLOAD, X_MESSAGES, X_OFFERS, X_EVIDENCE, X_FLAG_SETS, X_ARGUMENTS, NKIT
};

/* collector/_evidence.c */
int evidence_scan(PyObject *spec, const uint8_t *text, Py_ssize_t n, int failed, uint32_t *mask, int *payment);
int json_canonical(const uint8_t *text, Py_ssize_t n, PyObject **out);
int json_row_text(const uint8_t *text, Py_ssize_t n, PyObject **out);

typedef struct {
    PyObject **kit;
    const SpanS *const *s; /* the trace's spans in session order */
    size_t n;
    PyObject **keys, **sids, **finish, **model, **error, **unknown, **answer, **asked, **input;
    int *step_limit, *invalid, *payment;
} Build;

static PyObject *text(Str s) {
    if (s.n < 0) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)s.p, s.n, NULL);
}

static PyObject *hex(const uint8_t *s, size_t n) {
    static const char H[] = "0123456789abcdef";
    char out[32];
    for (size_t i = 0; i < n; i++) out[2 * i] = H[s[i] >> 4], out[2 * i + 1] = H[s[i] & 15];
    return PyUnicode_FromStringAndSize(out, (Py_ssize_t)(2 * n));
}

static int cmp_key(const void *a, const void *b) {
    const SpanS *x = *(const SpanS *const *)a, *y = *(const SpanS *const *)b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return memcmp(x->sid, y->sid, 8);
}

static PyObject *call(PyObject *f, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *args = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (!args) return NULL;
    PyObject *r = PyObject_CallObject(f, args);
    Py_DECREF(args);
    return r;
}

static PyObject *opt_int(int has, int64_t v) { return has ? PyLong_FromLongLong(v) : Py_NewRef(Py_None); }

/* (value, count, first span) of the values, in first-seen order (base.tally). */
static PyObject *tally(Build *b, PyObject **values, const int *take) {
    PyObject *counts = PyDict_New(), *order = PyList_New(0), *out = NULL;
    if (!counts || !order) goto done;
    for (size_t i = 0; i < b->n; i++) {
        if (!take[i] || values[i] == Py_None) continue;
        PyObject *entry = PyDict_GetItemWithError(counts, values[i]);
        if (entry) {
            PyObject *c = PyLong_FromSsize_t(PyLong_AsSsize_t(PyList_GET_ITEM(entry, 0)) + 1);
            if (!c) goto done;
            PyList_SetItem(entry, 0, c);
            continue;
        }
        if (PyErr_Occurred()) goto done;
        entry = Py_BuildValue("[iOO]", 1, b->keys[i], values[i]);
        if (!entry || PyDict_SetItem(counts, values[i], entry) < 0 || PyList_Append(order, entry) < 0) {
            Py_XDECREF(entry);
            goto done;
        }
        Py_DECREF(entry);
    }
    out = PyTuple_New(PyList_GET_SIZE(order));
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *e = PyList_GET_ITEM(order, i);
        PyObject *t = PyTuple_Pack(3, PyList_GET_ITEM(e, 2), PyList_GET_ITEM(e, 0), PyList_GET_ITEM(e, 1));
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
done:
    Py_XDECREF(counts);
    Py_XDECREF(order);
    return out;
}

static PyObject *tuple_of(PyObject *list) {
    if (!list) return NULL;
    PyObject *t = PyList_AsTuple(list);
    Py_DECREF(list);
    return t;
}

static int append_new(PyObject *list, PyObject *item) {
    if (!item) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* The earliest (span, value) where take holds and the value is set (references.EarliestFact). */
static PyObject *earliest(Build *b, PyObject **values) {
    for (size_t i = 0; i < b->n; i++)
        if (values[i] && values[i] != Py_None) return PyTuple_Pack(2, b->keys[i], values[i]);
    Py_RETURN_NONE;
}

static int is_kind(const Build *b, size_t i, int kind) { return b->s[i]->kind == kind; }

static int asks_tools(const Build *b, size_t i) {
    return b->finish[i] != Py_None && PyUnicode_CompareWithASCIIString(b->finish[i], "tool_call") == 0;
}

static PyObject *activity(Build *b) {
    long llms = 0, finished = 0, tool_finishes = 0, limits = 0;
    for (size_t i = 0; i < b->n; i++) {
        limits += b->step_limit[i];
        if (!is_kind(b, i, K_LLM)) continue;
        llms++;
        if (b->finish[i] != Py_None && PyUnicode_GET_LENGTH(b->finish[i])) {
            finished++;
            tool_finishes += PyUnicode_CompareWithASCIIString(b->finish[i], "tool_call") == 0;
        }
    }
    return call(b->kit[X_ACTIVITY], "(llllii)", llms, finished, tool_finishes, limits, 0, 0);
}

static PyObject *answers(Build *b) {
    long latest = -1;
    for (size_t i = 0; i < b->n; i++)
        if (is_kind(b, i, K_LLM) && (latest < 0 || b->s[i]->end > b->s[latest]->end)) latest = (long)i;
    long said = -1; /* the latest-ending model call with an answer that asks for no tool */
    for (size_t i = 0; i < b->n; i++) {
        if (!is_kind(b, i, K_LLM) || !b->answer[i] || b->answer[i] == Py_None || asks_tools(b, i)) continue;
        int t = PyObject_IsTrue(b->answer[i]);
        if (t < 0) return NULL;
        if (t && (said < 0 || b->s[i]->end > b->s[said]->end)) said = (long)i;
    }
    PyObject *at = latest < 0 ? Py_NewRef(Py_None)
                 : Py_BuildValue("(KOO)", (unsigned long long)b->s[latest]->end, b->keys[latest],
                                 asks_tools(b, (size_t)latest) ? Py_True : Py_False);
    PyObject *ans = !at ? NULL : said < 0 ? Py_NewRef(Py_None)
                  : Py_BuildValue("(KOO)", (unsigned long long)b->s[said]->end, b->keys[said], b->answer[said]);
    PyObject *r = at && ans ? call(b->kit[X_ANSWERS], "(OO)", at, ans) : NULL;
    Py_XDECREF(at);
    Py_XDECREF(ans);
    return r;
}

/* A tool call's result read by the compiled evidence reader (when the kit has its spec and it does not
 * decline the text), its arguments by the reference's own reader: (arguments, canonical, flags, payment);
 * Py_None where the reader declines, so the caller reads the whole payload the reference's way. */
static PyObject *scanned_payload(Build *b, size_t i) {
    const SpanS *s = b->s[i];
    PyObject *spec = b->kit[X_EVIDENCE];
    if (spec == Py_None) Py_RETURN_NONE;
    int failed = PyObject_IsTrue(b->error[i]);
    if (failed < 0) return NULL;
    uint32_t mask = 0;
    int mentions = 0, r = s->result.n < 0 ? 1 : evidence_scan(spec, s->result.p, s->result.n, failed, &mask, &mentions);
    if (r <= 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *canonical = NULL; /* the call's identity, written in C where the text allows (else Python's) */
    if (s->arguments.n < 0) canonical = PyUnicode_FromString("null");
    else if (json_canonical(s->arguments.p, s->arguments.n, &canonical) < 0) return NULL;
    if (s->arguments.n < 0 && !canonical) return NULL;
    PyObject *a = text(s->arguments), *out = NULL;
    PyObject *args = a ? PyObject_CallFunctionObjArgs(b->kit[X_ARGUMENTS], a, canonical ? canonical : Py_None, NULL) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(canonical);
    if (!args) return NULL;
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2) {
        Py_DECREF(args);
        PyErr_SetString(PyExc_TypeError, "arguments gives (arguments, canonical)");
        return NULL;
    }
    PyObject *key = failed ? NULL : PyLong_FromUnsignedLong(mask);
    PyObject *flags = failed ? Py_NewRef(b->kit[X_NOTHING]) : key ? PyObject_GetItem(b->kit[X_FLAG_SETS], key) : NULL;
    Py_XDECREF(key);
    if (flags)
        out = Py_BuildValue("(OOOO)", PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1), flags,
                            (mentions || (failed && b->payment[i])) ? Py_True : Py_False);
    Py_XDECREF(flags);
    Py_DECREF(args);
    return out;
}

/* A tool call's arguments and result: (arguments, canonical arguments, flags, mentions payment). */
static PyObject *payload(Build *b, size_t i) {
    const SpanS *s = b->s[i];
    if (s->arguments.n < 0 && s->result.n < 0) {
        int failed = b->error[i] != Py_None;
        return Py_BuildValue("(OsOO)", Py_None, "null", failed ? b->kit[X_NOTHING] : b->kit[X_OK_FLAGS],
                             failed ? (b->payment[i] ? Py_True : Py_False) : b->kit[X_OK_PAYMENT]);
    }
    PyObject *scanned = scanned_payload(b, i);
    if (scanned != Py_None) return scanned;
    Py_DECREF(scanned);
    PyObject *a = text(s->arguments), *r = a ? text(s->result) : NULL, *out = NULL;
    if (r) out = PyObject_CallFunctionObjArgs(b->kit[X_PAYLOAD], a, r, b->error[i], NULL);
    Py_XDECREF(a);
    Py_XDECREF(r);
    if (out && (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 4)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "payload gives (arguments, canonical, flags, payment)");
        return NULL;
    }
    return out;
}

static PyObject *calls(Build *b, PyObject *trace_id) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (size_t i = 0; i < b->n; i++) {
        if (!is_kind(b, i, K_TOOL)) continue;
        const SpanS *s = b->s[i];
        PyObject *tool = text(s->tool), *p = tool ? payload(b, i) : NULL, *c = NULL;
        if (p)
            c = PyObject_CallFunction(
                b->kit[X_CALLFACTS], "OOKOOOOOOOO", b->keys[i], b->sids[i], (unsigned long long)s->end, tool,
                PyTuple_GET_ITEM(p, 1), b->error[i], PyTuple_GET_ITEM(p, 2),
                (b->invalid[i] || b->unknown[i] != Py_None) ? Py_True : Py_False, PyTuple_GET_ITEM(p, 3),
                PyTuple_GET_ITEM(p, 0), trace_id);
        Py_XDECREF(tool);
        Py_XDECREF(p);
        if (append_new(out, c) < 0) goto fail;
    }
    return tuple_of(out);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *cost(Build *b) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (size_t i = 0; i < b->n; i++) {
        const SpanS *s = b->s[i];
        if (!is_kind(b, i, K_LLM) || (!s->has_in && !s->has_out)) continue;
        PyObject *in = opt_int(s->has_in, s->in), *o = opt_int(s->has_out, s->out), *c = NULL;
        if (in && o) c = call(b->kit[X_COST], "(OOO)", b->model[i], in, o);
        Py_XDECREF(in);
        Py_XDECREF(o);
        if (!c) goto fail;
        PyObject *pair = PyTuple_Pack(2, b->keys[i], c);
        Py_DECREF(c);
        if (append_new(out, pair) < 0) goto fail;
    }
    return tuple_of(out);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *starts(Build *b) {
    PyObject *llms = PyList_New(0), *tools = PyList_New(0), *r = NULL;
    if (!llms || !tools) goto done;
    for (size_t i = 0; i < b->n; i++) {
        PyObject *into = is_kind(b, i, K_LLM) ? llms : is_kind(b, i, K_TOOL) ? tools : NULL;
        if (into && PyList_Append(into, PyTuple_GET_ITEM(b->keys[i], 0)) < 0) goto done;
    }
    PyObject *a = PyList_AsTuple(llms), *c = a ? PyList_AsTuple(tools) : NULL;
    if (a && c) r = PyObject_CallFunctionObjArgs(b->kit[X_STARTS], a, c, NULL);
    Py_XDECREF(a);
    Py_XDECREF(c);
done:
    Py_XDECREF(llms);
    Py_XDECREF(tools);
    return r;
}

static PyObject *extent(Build *b, PyObject *trace_id) {
    uint64_t lo = 0, hi = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->s[i]->start && (!lo || b->s[i]->start < lo)) lo = b->s[i]->start;
        if (b->s[i]->end > hi) hi = b->s[i]->end;
    }
    PyObject *ids = PyFrozenSet_New(NULL), *first = NULL, *last = NULL, *r = NULL;
    if (!ids || PySet_Add(ids, trace_id) < 0) goto done;
    first = lo ? PyLong_FromUnsignedLongLong(lo) : Py_NewRef(Py_None);
    last = hi ? PyLong_FromUnsignedLongLong(hi) : Py_NewRef(Py_None);
    if (first && last)
        r = PyObject_CallFunction(b->kit[X_EXTENT], "OOOOOn", ids, b->keys[0], b->keys[b->n - 1], first, last,
                                  (Py_ssize_t)b->n);
done:
    Py_XDECREF(ids);
    Py_XDECREF(first);
    Py_XDECREF(last);
    return r;
}

static PyObject *models(Build *b) {
    int *llm = malloc(b->n * sizeof *llm), *all = malloc(b->n * sizeof *all);
    PyObject *first = NULL, *t1 = NULL, *t2 = NULL, *r = NULL;
    if (!llm || !all) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < b->n; i++) {
        all[i] = 1;
        llm[i] = is_kind(b, i, K_LLM);
        if (llm[i] && !first && b->model[i] != Py_None) first = PyTuple_Pack(2, b->keys[i], b->model[i]);
    }
    if (!first && PyErr_Occurred()) goto done;
    if (!first) first = Py_NewRef(Py_None);
    t1 = tally(b, b->model, llm);
    t2 = t1 ? tally(b, b->model, all) : NULL;
    if (t2) r = PyObject_CallFunctionObjArgs(b->kit[X_MODELS], first, t1, t2, NULL);
done:
    free(llm);
    free(all);
    Py_XDECREF(first);
    Py_XDECREF(t1);
    Py_XDECREF(t2);
    return r;
}

static PyObject *bare_and_named(Build *b, PyObject *ran, PyObject *name) {
    if (PySet_Add(ran, name) < 0) return NULL;
    PyObject *bare = PyObject_CallOneArg(b->kit[X_BARE], name);
    if (!bare) return NULL;
    int r = PySet_Add(ran, bare);
    Py_DECREF(bare);
    return r < 0 ? NULL : ran;
}

static PyObject *refused(Build *b, PyObject *offered) {
    PyObject *ran = PyFrozenSet_New(NULL), *names = PySet_New(NULL), *span_refused = PyList_New(0),
             *unknown = PyList_New(0), *r = NULL, *t1 = NULL, *t2 = NULL, *empty = NULL;
    if (!ran || !names || !span_refused || !unknown) goto done;
    for (size_t i = 0; i < b->n; i++) {
        if (!is_kind(b, i, K_TOOL)) continue;
        PyObject *tool = text(b->s[i]->tool);
        if (!tool) goto done;
        PyObject *ok;
        if (b->unknown[i] == Py_None) {
            ok = bare_and_named(b, ran, tool);
        } else {
            ok = PySet_Add(names, tool) < 0 ? NULL : names;
            if (ok && append_new(span_refused, PyTuple_Pack(2, b->keys[i], tool)) < 0) ok = NULL;
        }
        Py_DECREF(tool);
        if (!ok) goto done;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (is_kind(b, i, K_TOOL) || b->unknown[i] == Py_None) continue;
        int in_ran = PySet_Contains(ran, b->unknown[i]), in_refused = PySet_Contains(names, b->unknown[i]);
        if (in_ran < 0 || in_refused < 0) goto done;
        if (!in_ran && !in_refused && append_new(unknown, PyTuple_Pack(2, b->keys[i], b->unknown[i])) < 0) goto done;
    }
    empty = PyList_New(0); /* names model calls asked for, neither run, refused nor offered */
    if (!empty) goto done;
    for (size_t i = 0; i < b->n; i++) {
        if (!is_kind(b, i, K_LLM) || !b->asked[i]) continue;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(b->asked[i]); k++) {
            PyObject *name = PyTuple_GET_ITEM(b->asked[i], k);
            int a = PySet_Contains(ran, name), c = a < 0 ? -1 : PySet_Contains(names, name);
            int o = c < 0 ? -1 : PySet_Contains(offered, name);
            if (o < 0) goto done;
            if (!a && !c && !o && append_new(empty, PyTuple_Pack(2, b->keys[i], name)) < 0) goto done;
        }
    }
    t1 = PyList_AsTuple(span_refused);
    t2 = t1 ? PyList_AsTuple(unknown) : NULL;
    PyObject *t3 = t2 ? PyList_AsTuple(empty) : NULL;
    if (t3)
        r = PyObject_CallFunctionObjArgs(b->kit[X_REQUESTS], offered, PySet_GET_SIZE(ran) ? ran : b->kit[X_NOTHING],
                                         t1, t3, t2, NULL);
    Py_XDECREF(t3);
done:
    Py_XDECREF(ran);
    Py_XDECREF(names);
    Py_XDECREF(span_refused);
    Py_XDECREF(unknown);
    Py_XDECREF(t1);
    Py_XDECREF(t2);
    Py_XDECREF(empty);
    return r;
}

static PyObject *roots(Build *b) {
    PyObject *links = PyDict_New(), *agents = PyList_New(0), *r = NULL, *t = NULL;
    if (!links || !agents) goto done;
    for (size_t i = 0; i < b->n; i++) {
        const SpanS *s = b->s[i];
        PyObject *parent = s->pid ? hex(s->pid, 8) : PyUnicode_FromStringAndSize("", 0);
        if (!parent) goto done;
        PyObject *link = Py_BuildValue("(OOO)", PyTuple_GET_ITEM(b->keys[i], 0), PyTuple_GET_ITEM(b->keys[i], 1),
                                       s->kind == K_AGENT ? Py_None : parent);
        int bad = !link || PyDict_SetItem(links, b->sids[i], link) < 0;
        Py_XDECREF(link);
        if (!bad && s->kind == K_AGENT) {
            PyObject *name = text(s->agent), *in = opt_int(s->has_in, s->in), *out = opt_int(s->has_out, s->out);
            int configured = 0;
            if (name && name != Py_None && PyUnicode_GET_LENGTH(name)) {
                configured = PySequence_Contains(b->kit[X_AGENTS], name);
                if (configured < 0) bad = 1;
            }
            int asked = asks_tools(b, i);
            if (!bad && name && in && out)
                bad = append_new(agents, PyObject_CallFunction(
                    b->kit[X_ROOTFACTS], "OOOOOOOOOiO", b->keys[i], name, configured ? Py_True : Py_False, b->answer[i],
                    b->error[i] != Py_None ? Py_True : Py_False, in, out, b->model[i], parent, 0,
                    asked ? Py_True : Py_False)) < 0;
            else
                bad = 1;
            Py_XDECREF(name);
            Py_XDECREF(in);
            Py_XDECREF(out);
        }
        Py_DECREF(parent);
        if (bad) goto done;
    }
    t = PyList_AsTuple(agents);
    if (t) r = PyObject_CallFunctionObjArgs(b->kit[X_ROOTS], links, t, NULL);
done:
    Py_XDECREF(links);
    Py_XDECREF(agents);
    Py_XDECREF(t);
    return r;
}

static PyObject *services(Build *b) {
    PyObject **names = calloc(b->n, sizeof *names), *t = NULL, *configured = NULL, *r = NULL;
    int *all = malloc(b->n * sizeof *all);
    if (!names || !all) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < b->n; i++) {
        all[i] = 1;
        names[i] = b->s[i]->service.n > 0 ? text(b->s[i]->service) : Py_NewRef(Py_None);
        if (!names[i]) goto done;
        if (!configured && names[i] != Py_None) {
            int in = PySequence_Contains(b->kit[X_AGENTS], names[i]);
            if (in < 0) goto done;
            if (in && !(configured = PyTuple_Pack(2, b->keys[i], names[i]))) goto done;
        }
    }
    if (!configured) configured = Py_NewRef(Py_None);
    t = tally(b, names, all);
    if (t) r = PyObject_CallFunctionObjArgs(b->kit[X_SERVICES], t, configured, b->kit[X_NOTHING], NULL);
done:
    if (names)
        for (size_t i = 0; i < b->n; i++) Py_XDECREF(names[i]);
    free(names);
    free(all);
    Py_XDECREF(t);
    Py_XDECREF(configured);
    return r;
}

/* 1: summed; 0: a sum past 64 bits (the trace goes back). */
static int tokens(Build *b, PyObject **out) {
    int64_t in = 0, o = 0;
    long nin = 0, nout = 0;
    for (size_t i = 0; i < b->n; i++) {
        const SpanS *s = b->s[i];
        if (s->kind != K_LLM) continue;
        if (s->has_in && (nin++, __builtin_add_overflow(in, s->in, &in))) return 0;
        if (s->has_out && (nout++, __builtin_add_overflow(o, s->out, &o))) return 0;
    }
    *out = PyObject_CallFunction(b->kit[X_TOKENS], "LlLl", (long long)in, nin, (long long)o, nout);
    return *out ? 1 : -1;
}

/* The finish reason in one vocabulary (base.finish_reason). */
static PyObject *finish_of(PyObject **kit, Str s) {
    if (s.n <= 0) Py_RETURN_NONE;
    PyObject *raw = text(s);
    if (!raw) return NULL;
    PyObject *low = PyObject_CallMethod(raw, "lower", NULL);
    Py_DECREF(raw);
    if (!low) return NULL;
    PyObject *mapped = PyDict_GetItemWithError(kit[X_FINISH_MAP], low);
    if (mapped) {
        Py_DECREF(low);
        return Py_NewRef(mapped);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(low);
        return NULL;
    }
    return low;
}

/* normalize's error: the status message, error.type, else "error". */
static PyObject *error_of(const SpanS *s) {
    if (s->status_error) {
        if (s->status_msg.n > 0) return text(s->status_msg);
        if (s->error_type.n > 0) return text(s->error_type);
        return PyUnicode_FromString("error");
    }
    if (s->error_type.n > 0) return text(s->error_type);
    Py_RETURN_NONE;
}

/* A span's finish reason, answer, requested tools and first user message. Spans with messages are read
 * by the reference's own functions (JSON stays Python's here); the others from the finish reason alone. */
static int messages(Build *b, size_t i) {
    const SpanS *s = b->s[i];
    int reads = s->extract_kind != K_TOOL && (s->input.n >= 0 || s->output.n >= 0);
    if (!reads) {
        b->answer[i] = Py_NewRef(Py_None), b->asked[i] = NULL, b->input[i] = Py_NewRef(Py_None);
        return (b->finish[i] = finish_of(b->kit, s->finish)) ? 0 : -1;
    }
    static const char *const KINDS[] = {"other", "llm", "tool", "agent"};
    PyObject *in = text(s->input), *out = in ? text(s->output) : NULL, *fin = out ? text(s->finish) : NULL, *r = NULL;
    if (fin) r = PyObject_CallFunction(b->kit[X_MESSAGES], "sOOO", KINDS[s->extract_kind], in, out, fin);
    Py_XDECREF(in);
    Py_XDECREF(out);
    Py_XDECREF(fin);
    if (!r) return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(r, 2))) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "messages gives (finish reason, answer, requested tools, user text)");
        return -1;
    }
    b->finish[i] = Py_NewRef(PyTuple_GET_ITEM(r, 0));
    b->answer[i] = Py_NewRef(PyTuple_GET_ITEM(r, 1));
    b->asked[i] = Py_NewRef(PyTuple_GET_ITEM(r, 2));
    b->input[i] = Py_NewRef(PyTuple_GET_ITEM(r, 3));
    Py_DECREF(r);
    return 0;
}

/* The earliest (span, value) whose value is a non-empty string (references.EarliestFact, text only). */
static PyObject *earliest_text(Build *b, PyObject **values) {
    for (size_t i = 0; i < b->n; i++)
        if (values[i] && PyUnicode_Check(values[i]) && PyUnicode_GET_LENGTH(values[i]))
            return PyTuple_Pack(2, b->keys[i], values[i]);
    Py_RETURN_NONE;
}

#define NSTATES 20

/* The trace's states in FACTS order; Py_None when the trace goes back. */
static PyObject *build(PyObject **kit, const SpanS *const *s, size_t n, PyObject *trace_id) {
    Build b = {kit, s, n};
    PyObject *states = NULL, *r = NULL, *offers = NULL, *pairs = NULL;
    PyObject **objs = calloc(9 * n, sizeof *objs);
    int *flags = calloc(3 * n, sizeof *flags);
    if (!objs || !flags) {
        PyErr_NoMemory();
        goto done;
    }
    b.keys = objs, b.sids = objs + n, b.finish = objs + 2 * n, b.model = objs + 3 * n, b.error = objs + 4 * n;
    b.unknown = objs + 5 * n, b.answer = objs + 6 * n, b.asked = objs + 7 * n, b.input = objs + 8 * n;
    if (!(pairs = PyList_New(0))) goto done;
    b.step_limit = flags, b.invalid = flags + n, b.payment = flags + 2 * n;
    for (size_t i = 0; i < n; i++) {
        if (!(b.sids[i] = hex(s[i]->sid, 8))) goto done;
        if (!(b.keys[i] = Py_BuildValue("(KKO)", (unsigned long long)s[i]->start, (unsigned long long)s[i]->end,
                                        b.sids[i])))
            goto done;
        if (!(b.model[i] = text(s[i]->model)) || !(b.error[i] = error_of(s[i])) || messages(&b, i) < 0)
            goto done;
        if (s[i]->definitions.n >= 0) {
            PyObject *d = text(s[i]->definitions);
            if (!d || append_new(pairs, PyTuple_Pack(2, b.keys[i], d)) < 0) {
                Py_XDECREF(d);
                goto done;
            }
            Py_DECREF(d);
        }
        if (b.error[i] == Py_None) {
            b.unknown[i] = Py_NewRef(Py_None);
            continue;
        }
        PyObject *facts = PyObject_CallOneArg(kit[X_ERROR_FACTS], b.error[i]);
        if (!facts) goto done;
        if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != 4) {
            Py_DECREF(facts);
            PyErr_SetString(PyExc_TypeError, "error_facts gives (step limit, unknown tool, invalid, payment)");
            goto done;
        }
        b.step_limit[i] = PyObject_IsTrue(PyTuple_GET_ITEM(facts, 0)) == 1;
        b.unknown[i] = Py_NewRef(PyTuple_GET_ITEM(facts, 1));
        b.invalid[i] = PyObject_IsTrue(PyTuple_GET_ITEM(facts, 2)) == 1;
        b.payment[i] = PyObject_IsTrue(PyTuple_GET_ITEM(facts, 3)) == 1;
        Py_DECREF(facts);
    }
    PyObject *tok = NULL;
    int summed = tokens(&b, &tok);
    if (summed < 0) goto done;
    if (!summed) {
        r = Py_NewRef(Py_None);
        goto done;
    }
    states = PyTuple_New(NSTATES);
    if (!states) {
        Py_DECREF(tok);
        goto done;
    }
    PyTuple_SET_ITEM(states, 19, tok);
    PyObject *v;
#define SET(i, expr) do { if (!(v = (expr))) goto done; PyTuple_SET_ITEM(states, (i), v); } while (0)
    SET(0, activity(&b));
    SET(1, answers(&b));
    SET(2, calls(&b, trace_id));
    offers = PyList_GET_SIZE(pairs) ? PyObject_CallOneArg(kit[X_OFFERS], pairs) : NULL;
    if (offers && (!PyTuple_Check(offers) || PyTuple_GET_SIZE(offers) != 2 || !PyAnySet_Check(PyTuple_GET_ITEM(offers, 1)))) {
        PyErr_SetString(PyExc_TypeError, "offers gives (catalog, offered names)");
        goto done;
    }
    if (!offers && PyErr_Occurred()) goto done;
    SET(3, offers ? Py_NewRef(PyTuple_GET_ITEM(offers, 0)) : PyObject_CallNoArgs(kit[X_CATALOG]));
    SET(4, cost(&b));
    SET(5, starts(&b));
    SET(6, extent(&b, trace_id));
    SET(7, models(&b));
    for (int k = 9; k < 12; k++) SET(k, Py_NewRef(Py_None)); /* case, experiment, run: not read here */
    {
        PyObject **names = calloc(3 * n, sizeof *names);
        if (!names) {
            PyErr_NoMemory();
            goto done;
        }
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            names[i] = s[i]->kind == K_AGENT && s[i]->agent.n > 0 ? text(s[i]->agent) : Py_NewRef(Py_None);
            names[n + i] = s[i]->kind == K_AGENT && s[i]->workflow.n > 0 ? text(s[i]->workflow) : Py_NewRef(Py_None);
            names[2 * n + i] = s[i]->user.n > 0 ? text(s[i]->user) : Py_NewRef(Py_None);
            ok = names[i] && names[n + i] && names[2 * n + i];
        }
        PyObject *a = ok ? earliest(&b, names) : NULL, *w = a ? earliest(&b, names + n) : NULL;
        PyObject *u = w ? earliest(&b, names + 2 * n) : NULL;
        for (size_t i = 0; i < 3 * n; i++) Py_XDECREF(names[i]);
        free(names);
        if (!a || !w || !u) {
            Py_XDECREF(a);
            Py_XDECREF(w);
            goto done;
        }
        PyTuple_SET_ITEM(states, 12, a);
        PyTuple_SET_ITEM(states, 13, w);
        PyTuple_SET_ITEM(states, 8, u);
    }
    SET(14, earliest_text(&b, b.input));
    SET(15, refused(&b, offers ? PyTuple_GET_ITEM(offers, 1) : kit[X_NOTHING]));
    SET(16, roots(&b));
    SET(17, Py_NewRef(kit[X_SERVERS]));
    SET(18, services(&b));
#undef SET
    r = Py_NewRef(states);
done:
    Py_XDECREF(states);
    Py_XDECREF(offers);
    Py_XDECREF(pairs);
    if (objs)
        for (size_t i = 0; i < 9 * n; i++) Py_XDECREF(objs[i]);
    free(objs);
    free(flags);
    return r;
}

static int cmp_sid(const void *a, const void *b) {
    return memcmp((*(const SpanS *const *)a)->sid, (*(const SpanS *const *)b)->sid, 8);
}

static void walk_free(Walk *w) {
    free(w->spans);
    free(w->traces);
    free(w->table);
}

PyDoc_STRVAR(genai_summaries_doc,
"genai_summaries(body, enabled, deny, deny_prefixes, user_keys, session_keys, scopes, value_marks, kit[,\n"
"                max_value_bytes])\n"
"-> (summaries, handed_back, spans_read, spans_handed_back), or (None, why) when the whole body goes to Python.\n\n"
"summaries maps a trace id (hex) to its facts' states in FACTS order; handed_back lists the trace ids\n"
"Python summarizes. enabled: the keys read here; deny and deny_prefixes: keys that send their span's\n"
"trace back (read by normalize or marking another dialect; other keys are passed over); user_keys: the\n"
"keys normalize reads the user from, in its order; session_keys: (key, weak) pairs, the keys normalize reads\n"
"the session key from, in its order (the weak ones last); scopes: scope\n"
"names that mark another dialect; value_marks: (key, value) pairs that do; kit: scoring.facts' classes\n"
"and helpers (agentfunnel.collector.session.compiled builds it); max_value_bytes: a string value longer than this\n"
"is cut by the pipeline, so its span goes back (0: no limit).");

/* A tuple of str as UTF-8 slices (borrowed from the str objects, which the caller's tuple holds). */
static Str *slices(PyObject *tuple, Py_ssize_t *n, Py_ssize_t item) {
    *n = PyTuple_GET_SIZE(tuple);
    Str *out = PyMem_Calloc(*n ? (size_t)*n : 1, sizeof *out);
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *o = PyTuple_GET_ITEM(tuple, i);
        if (item >= 0) o = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 ? PyTuple_GET_ITEM(o, item) : NULL;
        const char *s = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &out[i].n) : NULL;
        if (!s) {
            PyMem_Free(out);
            *n = 0;
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "keys, prefixes and marks are strings");
            return NULL;
        }
        out[i].p = (const uint8_t *)s;
    }
    return out;
}

/* The walk's configuration from the caller's tuples (their strings stay the caller's: keep the tuples alive). */
static int walk_setup(Walk *w, PyObject *enabled, PyObject *deny, PyObject *prefixes, PyObject *users,
                      PyObject *sessions, PyObject *scopes, PyObject *marks) {
    memset(w, 0, sizeof *w);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(enabled); i++) {
        PyObject *k = PyTuple_GET_ITEM(enabled, i);
        Py_ssize_t n;
        const char *s = PyUnicode_Check(k) ? PyUnicode_AsUTF8AndSize(k, &n) : NULL;
        if (!s) {
            PyErr_SetString(PyExc_TypeError, "enabled keys are strings");
            return -1;
        }
        int r = role_of((const uint8_t *)s, (size_t)n);
        if (r >= 0) w->enabled |= 1u << r;
    }
    Py_ssize_t nvalues;
    if (!(w->deny = slices(deny, &w->ndeny, -1)) || !(w->deny_prefixes = slices(prefixes, &w->ndeny_prefixes, -1)) ||
        !(w->mark_keys = slices(marks, &w->nmarks, 0)) || !(w->mark_values = slices(marks, &nvalues, 1)) ||
        !(w->user_keys = slices(users, &w->nuser_keys, -1)) || !(w->session_keys = slices(sessions, &w->nsession_keys, 0)))
        return -1;
    w->nstrong = w->nsession_keys;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sessions); i++) { /* (key, weak): the weak ones last */
        int weak = PyObject_IsTrue(PyTuple_GET_ITEM(PyTuple_GET_ITEM(sessions, i), 1));
        if (weak < 0) return -1;
        if (weak && w->nstrong == w->nsession_keys) w->nstrong = i;
    }
    w->scopes = scopes;
    return 0;
}

static void walk_config_free(Walk *w) {
    PyMem_Free(w->deny);
    PyMem_Free(w->deny_prefixes);
    PyMem_Free(w->mark_keys);
    PyMem_Free(w->mark_values);
    PyMem_Free(w->user_keys);
    PyMem_Free(w->session_keys);
}

/* Walk a body: 0 read (its spans by trace in w), 1 the whole body goes back (*why set), -1 error. */
static int walk_body(Walk *w, const uint8_t *body, Py_ssize_t len, PyObject **why) {
    w->start0 = w->last = body;
    w->end0 = body + len;
    if (request(w, body, w->end0) < 0) {
        if (PyErr_Occurred()) return -1;
        *why = PyUnicode_FromFormat("%s (the field at byte %zd)", w->why ? w->why : "unreadable",
                                    (Py_ssize_t)(w->last - w->start0));
        return *why ? 1 : -1;
    }
    return 0;
}

/* The spans of each walked trace together: trace t's are order[at[t]] to order[at[t + 1]] (both malloc'ed). */
static int group(const Walk *w, const SpanS ***order_out, size_t **at_out) {
    const SpanS **order = malloc((w->nspans ? w->nspans : 1) * sizeof *order);
    size_t *at = calloc(w->ntraces + 1, sizeof *at), *fill = calloc(w->ntraces + 1, sizeof *fill);
    if (!order || !at || !fill) {
        free(order), free(at), free(fill);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < w->nspans; i++) at[w->spans[i].trace + 1]++;
    for (size_t t = 0; t < w->ntraces; t++) at[t + 1] += at[t];
    for (size_t i = 0; i < w->nspans; i++) {
        uint32_t t = w->spans[i].trace;
        order[at[t] + fill[t]++] = &w->spans[i];
    }
    free(fill);
    *order_out = order, *at_out = at;
    return 0;
}

static int same_str(Str a, Str b) { return a.n == b.n && (a.n <= 0 || !memcmp(a.p, b.p, (size_t)a.n)); }

/* Whether a trace rule (semconv/trace_rules.py) would change a record of these spans (sorted by span id):
 * a tool call inside a tool call of the same name (one call seen twice), or a trace whose agent activity is
 * only create_agent spans (set-up). The stage reads such a trace with its records. */
static int ruled(const SpanS **s, size_t n) {
    int setup = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        const SpanS *x = s[i];
        if (x->kind == K_LLM || x->kind == K_TOOL || (x->kind == K_AGENT && !x->setup)) other = 1;
        setup |= x->setup;
        if (x->kind != K_TOOL || !x->pid) continue;
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = memcmp(s[mid]->sid, x->pid, 8);
            if (!c) {
                if (s[mid]->kind == K_TOOL && same_str(s[mid]->tool, x->tool)) return 1;
                break;
            }
            if (c < 0) lo = mid + 1;
            else hi = mid;
        }
    }
    return setup && !other;
}

/* A trace's states from its spans (any order; sorted here), Py_None when it goes back: a span id twice (read
 * as the later span by facts that look spans up, in Python), a trace rule that changes a record, or a span
 * the states cannot be made of. */
static PyObject *trace_states(PyObject **kit, const SpanS **s, size_t n, PyObject *tid) {
    if (!n) Py_RETURN_NONE;
    qsort(s, n, sizeof *s, cmp_sid);
    for (size_t i = 1; i < n; i++)
        if (memcmp(s[i]->sid, s[i - 1]->sid, 8) == 0) Py_RETURN_NONE;
    if (ruled(s, n)) Py_RETURN_NONE;
    qsort(s, n, sizeof *s, cmp_key);
    return build(kit, s, n, tid);
}

PyObject *genai_summaries(PyObject *self, PyObject *args) {
    Py_buffer body;
    PyObject *enabled, *deny, *prefixes, *users, *sessions, *scopes, *marks, *kit;
    Py_ssize_t max_value = 0;
    if (!PyArg_ParseTuple(args, "y*O!O!O!O!O!O!O!O!|n", &body, &PyTuple_Type, &enabled, &PyTuple_Type, &deny,
                          &PyTuple_Type, &prefixes, &PyTuple_Type, &users, &PyTuple_Type, &sessions, &PyFrozenSet_Type,
                          &scopes, &PyTuple_Type, &marks, &PyTuple_Type, &kit, &max_value))
        return NULL;
    PyObject *result = NULL, *summaries = NULL, *back = NULL, *why = NULL;
    const SpanS **order = NULL;
    size_t *at = NULL;
    Walk w;
    memset(&w, 0, sizeof w);
    if (PyTuple_GET_SIZE(kit) != NKIT) {
        PyErr_Format(PyExc_TypeError, "the kit has %zd entries, expected %d", PyTuple_GET_SIZE(kit), NKIT);
        goto done;
    }
    if (walk_setup(&w, enabled, deny, prefixes, users, sessions, scopes, marks) < 0) goto done;
    w.max_value = max_value;
    int walked = walk_body(&w, body.buf, body.len, &why);
    if (walked) {
        if (walked > 0) result = PyTuple_Pack(2, Py_None, why);
        goto done;
    }
    if (group(&w, &order, &at) < 0) goto done;
    summaries = PyDict_New();
    back = PyList_New(0);
    Py_ssize_t read = 0, handed = 0;
    if (!summaries || !back) goto done;
    for (size_t t = 0; t < w.ntraces; t++) {
        TraceS *tr = &w.traces[t];
        PyObject *tid = hex(tr->tid, 16), *states = NULL;
        if (!tid) goto done;
        states = tr->bad ? Py_NewRef(Py_None)
                         : trace_states((PyObject **)&PyTuple_GET_ITEM(kit, 0), order + at[t], at[t + 1] - at[t], tid);
        if (!states) {
            Py_DECREF(tid);
            goto done;
        }
        int err;
        if (states != Py_None) {
            err = PyDict_SetItem(summaries, tid, states);
            read += (Py_ssize_t)tr->nspans;
        } else {
            err = PyList_Append(back, tid);
            handed += (Py_ssize_t)tr->nspans;
        }
        Py_DECREF(states);
        Py_DECREF(tid);
        if (err < 0) goto done;
    }
    result = Py_BuildValue("(OOnn)", summaries, back, read, handed);
done:
    walk_config_free(&w);
    Py_XDECREF(summaries);
    Py_XDECREF(back);
    Py_XDECREF(why);
    free(order);
    free(at);
    walk_free(&w);
    PyBuffer_Release(&body);
    return result;
}

const char *const genai_summaries_doc_text = genai_summaries_doc;

/* ---- states kept across requests --------------------------------------------------------------- */

/* A span kept with its trace: the walk's fields packed into one block of its own (``keep_span``), made a SpanS
 * again when its trace is taken (``unpack_span``). */
typedef struct {
    uint8_t *block;
    size_t size;
} KeptSpan;

typedef struct {
    KeptSpan *spans;
    size_t n, cap, bytes;
    int back; /* handed back: the records path reads the whole trace */
    uint8_t tid[16]; /* its id, once for all its spans */
} KeptTrace;

typedef struct {
    PyObject_HEAD
    Walk config;
    PyObject *refs; /* the tuples the configuration's strings point into, and the kit */
    PyObject *kit;
    PyObject *slots_of; /* trace id (hex) -> slot */
    KeptTrace *slots;
    size_t nslots, capslots;
    size_t *free_slots;
    size_t nfree, capfree;
    Py_ssize_t bytes, spans, handed_back;
    int ready; /* __init__ went through */
    int busy;  /* a method is running (it may call Python: the kit's readers): no other may start meanwhile */
} TraceStates;

/* Enter a method: the object is made and no other method is running on it (from a reader the kit calls, or
 * from another thread while one runs Python). 0 entered, -1 refused (an exception set). */
static int enter(TraceStates *self) {
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "TraceStates is not made");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "TraceStates is in use (one caller at a time)");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static PyObject *leave(TraceStates *self, PyObject *result) {
    self->busy = 0;
    return result;
}

/* Enter a method called with a trace id (hex). */
static int enter_trace(TraceStates *self, PyObject *tid) {
    if (enter(self) < 0) return -1;
    if (PyUnicode_Check(tid)) return 0;
    PyErr_SetString(PyExc_TypeError, "a trace id (hex)");
    self->busy = 0;
    return -1;
}

static const size_t SPAN_STRS[] = {
    offsetof(SpanS, name), offsetof(SpanS, model), offsetof(SpanS, tool), offsetof(SpanS, agent),
    offsetof(SpanS, workflow), offsetof(SpanS, error_type), offsetof(SpanS, status_msg), offsetof(SpanS, finish),
    offsetof(SpanS, service), offsetof(SpanS, arguments), offsetof(SpanS, result), offsetof(SpanS, user),
    offsetof(SpanS, input), offsetof(SpanS, output), offsetof(SpanS, definitions), offsetof(SpanS, version),
    offsetof(SpanS, session), offsetof(SpanS, call_id), offsetof(SpanS, provider),
};
#define NSPAN_STRS (sizeof SPAN_STRS / sizeof *SPAN_STRS)
#define KEPT_SPAN_OVERHEAD (sizeof(KeptSpan) + 16) /* the struct and the allocator's header, roughly */

/* Room for one more item in *items (*cap of them, each ``size`` bytes, ``n`` used; ``first`` at first): 0, or -1
 * out of memory. */
static int room(void **items, size_t *cap, size_t n, size_t size, size_t first) {
    if (n < *cap) return 0;
    size_t more = *cap ? *cap * 2 : first;
    void *p = PyMem_Realloc(*items, more * size);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *items = p, *cap = more;
    return 0;
}

/* A kept span's block, in the order ``keep_span`` writes it: its span id (8 bytes; the trace id is its trace's,
 * kept once); one byte of flags (F_*), one each for its kind, extract kind and status code; a mask of the strings
 * present (bit k: SPAN_STRS[k], absent ones leave theirs clear); the parent id (8, when it has one), start and end
 * (8 each), input and output tokens (8 each, when given); each present string's length as a varint, then their
 * bytes one after another. About 55 bytes beside its strings for a span of the hot dialect (a fixed layout with
 * the trace id took 180). */
enum { F_PID = 1, F_WEAK_SESSION = 2, F_GENAI = 4, F_STATUS_ERROR = 8, F_HAS_IN = 16, F_HAS_OUT = 32, F_SETUP = 64 };
#define PACKED_HEAD 16 /* the span id, the four bytes, the mask */
#define MAX_PACKED_FIXED (PACKED_HEAD + 8 * 5 + 5 * NSPAN_STRS) /* and at most this before the strings */
_Static_assert(NSPAN_STRS <= 32, "a kept span's mask has a bit per string");

static uint8_t *put_u64(uint8_t *p, uint64_t v) { return memcpy(p, &v, 8), p + 8; }
static const uint8_t *get_u64(const uint8_t *p, uint64_t *v) { return memcpy(v, p, 8), p + 8; }

static uint8_t *put_varint(uint8_t *p, uint32_t v) {
    while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
    *p++ = (uint8_t)v;
    return p;
}

static const uint8_t *get_varint(const uint8_t *p, uint32_t *v) { /* written by put_varint: at most 5 bytes */
    uint32_t out = 0;
    for (int shift = 0;; shift += 7) {
        uint8_t b = *p++;
        out |= (uint32_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    *v = out;
    return p;
}

static int keep_span(KeptTrace *t, const SpanS *src) {
    uint8_t fixed[MAX_PACKED_FIXED];
    memcpy(fixed, src->sid, 8);
    fixed[8] = (uint8_t)((src->pid ? F_PID : 0) | (src->weak_session ? F_WEAK_SESSION : 0) | (src->genai ? F_GENAI : 0) |
                          (src->status_error ? F_STATUS_ERROR : 0) | (src->has_in ? F_HAS_IN : 0) |
                          (src->has_out ? F_HAS_OUT : 0) | (src->setup ? F_SETUP : 0));
    fixed[9] = (uint8_t)src->kind, fixed[10] = (uint8_t)src->extract_kind, fixed[11] = (uint8_t)src->status_code;
    uint8_t *p = fixed + PACKED_HEAD;
    if (src->pid) memcpy(p, src->pid, 8), p += 8;
    p = put_u64(p, src->start), p = put_u64(p, src->end);
    if (src->has_in) p = put_u64(p, (uint64_t)src->in);
    if (src->has_out) p = put_u64(p, (uint64_t)src->out);
    uint32_t mask = 0;
    size_t strings = 0;
    for (size_t k = 0; k < NSPAN_STRS; k++) {
        const Str *x = (const Str *)((const char *)src + SPAN_STRS[k]);
        if (x->n < 0) continue;
        if (x->n > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a string of a kept span is longer than 2 GiB");
            return -1;
        }
        mask |= 1u << k;
        strings += (size_t)x->n;
        p = put_varint(p, (uint32_t)x->n);
    }
    memcpy(fixed + 12, &mask, 4);
    size_t head = (size_t)(p - fixed), size = head + strings;
    if (room((void **)&t->spans, &t->cap, t->n, sizeof *t->spans, 8) < 0) return -1;
    uint8_t *block = PyMem_Malloc(size);
    if (!block) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(block, fixed, head);
    p = block + head;
    for (size_t k = 0; k < NSPAN_STRS; k++) { /* nothing kept points into the request */
        const Str *x = (const Str *)((const char *)src + SPAN_STRS[k]);
        if (x->n > 0) memcpy(p, x->p, (size_t)x->n), p += x->n;
    }
    if (!t->n) memcpy(t->tid, src->tid, 16);
    KeptSpan *k = &t->spans[t->n];
    k->block = block, k->size = size + KEPT_SPAN_OVERHEAD;
    t->n++;
    t->bytes += k->size;
    return 0;
}

/* The kept span as the walk read it, its ids and strings pointing into its block. */
static void unpack_span(const KeptTrace *t, const KeptSpan *k, SpanS *s) {
    const uint8_t *b = k->block, *p = b + PACKED_HEAD;
    uint8_t flags = b[8];
    uint32_t mask, lens[NSPAN_STRS];
    memcpy(&mask, b + 12, 4);
    memset(s, 0, sizeof *s);
    s->tid = t->tid, s->sid = b;
    s->weak_session = !!(flags & F_WEAK_SESSION), s->genai = !!(flags & F_GENAI);
    s->status_error = !!(flags & F_STATUS_ERROR), s->has_in = !!(flags & F_HAS_IN), s->has_out = !!(flags & F_HAS_OUT);
    s->setup = !!(flags & F_SETUP);
    s->kind = b[9], s->extract_kind = b[10], s->status_code = b[11];
    if (flags & F_PID) s->pid = p, p += 8;
    uint64_t v;
    p = get_u64(p, &s->start), p = get_u64(p, &s->end);
    if (s->has_in) p = get_u64(p, &v), s->in = (int64_t)v;
    if (s->has_out) p = get_u64(p, &v), s->out = (int64_t)v;
    for (size_t i = 0; i < NSPAN_STRS; i++)
        if (mask >> i & 1) p = get_varint(p, &lens[i]);
    for (size_t i = 0; i < NSPAN_STRS; i++) {
        Str *x = (Str *)((char *)s + SPAN_STRS[i]);
        if (!(mask >> i & 1)) {
            x->n = -1, x->p = NULL;
            continue;
        }
        x->n = (Py_ssize_t)lens[i];
        x->p = p; /* an empty string: any address; an absent one: none */
        p += lens[i];
    }
}

static void trace_clear(KeptTrace *t) {
    for (size_t i = 0; i < t->n; i++) PyMem_Free(t->spans[i].block);
    PyMem_Free(t->spans);
    memset(t, 0, sizeof *t);
}

/* The slot of a trace (made when ``make``); -1 absent, -2 error. */
static Py_ssize_t slot_of(TraceStates *self, PyObject *tid, int make) {
    PyObject *at = PyDict_GetItemWithError(self->slots_of, tid);
    if (at) return PyLong_AsSsize_t(at);
    if (PyErr_Occurred()) return -2;
    if (!make) return -1;
    size_t slot;
    int reused = self->nfree > 0;
    if (reused) slot = self->free_slots[--self->nfree];
    else {
        if (room((void **)&self->slots, &self->capslots, self->nslots, sizeof *self->slots, 64) < 0) return -2;
        slot = self->nslots++;
    }
    memset(&self->slots[slot], 0, sizeof self->slots[slot]);
    PyObject *v = PyLong_FromSize_t(slot);
    int err = v ? PyDict_SetItem(self->slots_of, tid, v) : -1;
    Py_XDECREF(v);
    if (err < 0) { /* the slot goes back where it came from */
        if (reused) self->nfree++;
        else self->nslots--;
        return -2;
    }
    return (Py_ssize_t)slot;
}

/* Take the trace's slot out (its entry deleted first, then the slot freed for reuse); what it kept moves to
 * *out, the caller's to clear. 0, or -1 error (nothing changed). */
static int detach(TraceStates *self, PyObject *tid, size_t slot, KeptTrace *out) {
    if (room((void **)&self->free_slots, &self->capfree, self->nfree, sizeof *self->free_slots, 64) < 0) return -1;
    if (PyDict_DelItem(self->slots_of, tid) < 0) return -1;
    *out = self->slots[slot];
    memset(&self->slots[slot], 0, sizeof self->slots[slot]);
    self->free_slots[self->nfree++] = slot;
    self->bytes -= (Py_ssize_t)out->bytes;
    self->spans -= (Py_ssize_t)out->n;
    return 0;
}

static int TraceStates_init(TraceStates *self, PyObject *args, PyObject *kwds) {
    PyObject *enabled, *deny, *prefixes, *users, *sessions, *scopes, *marks, *kit;
    Py_ssize_t max_value = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!|n", &PyTuple_Type, &enabled, &PyTuple_Type, &deny, &PyTuple_Type,
                          &prefixes, &PyTuple_Type, &users, &PyTuple_Type, &sessions, &PyFrozenSet_Type, &scopes,
                          &PyTuple_Type, &marks, &PyTuple_Type, &kit, &max_value))
        return -1;
    if (self->refs || self->ready) {
        PyErr_SetString(PyExc_TypeError, "TraceStates is made once");
        return -1;
    }
    if (PyTuple_GET_SIZE(kit) != NKIT) {
        PyErr_Format(PyExc_TypeError, "the kit has %zd entries, expected %d", PyTuple_GET_SIZE(kit), NKIT);
        return -1;
    }
    if (!(self->refs = PyTuple_Pack(7, enabled, deny, prefixes, users, sessions, scopes, marks))) return -1;
    self->kit = Py_NewRef(kit);
    if (!(self->slots_of = PyDict_New())) return -1;
    if (walk_setup(&self->config, enabled, deny, prefixes, users, sessions, scopes, marks) < 0) return -1;
    self->config.max_value = max_value;
    self->ready = 1;
    return 0;
}

static void TraceStates_dealloc(TraceStates *self) {
    for (size_t i = 0; i < self->nslots; i++) trace_clear(&self->slots[i]);
    PyMem_Free(self->slots);
    PyMem_Free(self->free_slots);
    walk_config_free(&self->config);
    Py_XDECREF(self->slots_of);
    Py_XDECREF(self->kit);
    Py_XDECREF(self->refs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Mark a trace handed back (what was kept of it let go): 0, or -1 error. */
static int hand_back(TraceStates *self, PyObject *tid) {
    Py_ssize_t slot = slot_of(self, tid, 1);
    if (slot < 0) return -1;
    KeptTrace *t = &self->slots[slot];
    self->bytes -= (Py_ssize_t)t->bytes;
    self->spans -= (Py_ssize_t)t->n;
    if (!t->back) self->handed_back++;
    trace_clear(t);
    t->back = 1;
    return 0;
}

/* The session key the trace's spans of this body name (a strong one first), or NULL with no error: a hint of
 * which traces belong together, before they are taken. */
static PyObject *session_hint(const SpanS **order, size_t from, size_t to) {
    const SpanS *weak = NULL;
    for (size_t i = from; i < to; i++) {
        if (order[i]->session.n <= 0) continue;
        if (!order[i]->weak_session) return text(order[i]->session);
        if (!weak) weak = order[i];
    }
    return weak ? text(weak->session) : NULL;
}

static PyObject *add_walked(TraceStates *self, Walk *w, const SpanS **order, const size_t *at) {
    PyObject *back = PyList_New(0), *hints = PyDict_New(), *costs = PyDict_New();
    if (!back || !hints || !costs) {
        Py_XDECREF(back);
        Py_XDECREF(hints);
        Py_XDECREF(costs);
        return NULL;
    }
    Py_ssize_t read = 0, handed = 0;
    for (size_t t = 0; t < w->ntraces; t++) {
        TraceS *tr = &w->traces[t];
        PyObject *tid = hex(tr->tid, 16);
        Py_ssize_t slot = tid ? slot_of(self, tid, 1) : -2;
        int err = slot < 0;
        if (!err && (tr->bad || self->slots[slot].back)) {
            err = hand_back(self, tid) < 0 || PyList_Append(back, tid) < 0;
            handed += (Py_ssize_t)tr->nspans;
        } else if (!err) {
            KeptTrace *kept = &self->slots[slot];
            size_t bytes = kept->bytes, n = kept->n;
            for (size_t i = at[t]; i < at[t + 1] && !err; i++) err = keep_span(kept, order[i]) < 0;
            self->bytes += (Py_ssize_t)(kept->bytes - bytes);
            self->spans += (Py_ssize_t)(kept->n - n);
            if (err) { /* out of memory part way: the records path reads the whole trace, nothing half kept */
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                hand_back(self, tid);
                PyErr_Restore(type, value, tb);
            } else {
                PyObject *cost = PyLong_FromSize_t(kept->bytes - bytes), *hint = session_hint(order, at[t], at[t + 1]);
                err = !cost || PyDict_SetItem(costs, tid, cost) < 0;
                if (hint) err = err || PyDict_SetItem(hints, tid, hint) < 0;
                else if (!err) PyErr_Clear(); /* none, or not text: only a hint */
                Py_XDECREF(cost);
                Py_XDECREF(hint);
            }
            read += (Py_ssize_t)tr->nspans;
        }
        Py_XDECREF(tid);
        if (err) {
            Py_DECREF(back);
            Py_DECREF(hints);
            Py_DECREF(costs);
            return NULL;
        }
    }
    PyObject *result = Py_BuildValue("(OnnOO)", back, read, handed, hints, costs);
    Py_DECREF(back);
    Py_DECREF(hints);
    Py_DECREF(costs);
    return result;
}

static PyObject *TraceStates_add(TraceStates *self, PyObject *arg) {
    if (enter(self) < 0) return NULL;
    Py_buffer body;
    if (PyObject_GetBuffer(arg, &body, PyBUF_SIMPLE) < 0) return leave(self, NULL);
    Walk w = self->config;
    w.spans = NULL, w.traces = NULL, w.table = NULL;
    w.nspans = w.capspans = w.ntraces = w.captraces = w.tablecap = 0;
    w.why = NULL;
    PyObject *result = NULL, *why = NULL;
    const SpanS **order = NULL;
    size_t *at = NULL;
    int walked = walk_body(&w, body.buf, body.len, &why);
    if (walked > 0) result = PyTuple_Pack(2, Py_None, why);
    else if (!walked && group(&w, &order, &at) == 0) result = add_walked(self, &w, order, at);
    Py_XDECREF(why);
    free(order);
    free(at);
    walk_free(&w);
    PyBuffer_Release(&body);
    return leave(self, result);
}

static PyObject *TraceStates_hand_back(TraceStates *self, PyObject *tid) {
    if (enter_trace(self, tid) < 0) return NULL;
    return leave(self, hand_back(self, tid) < 0 ? NULL : Py_NewRef(Py_None));
}

static PyObject *opt_text(Str s) { return s.n >= 0 ? text(s) : Py_NewRef(Py_None); }

/* A tool call's arguments or result as its row holds them, json.dumps(parse_json(text), ensure_ascii=False) written
 * from the bytes kept (None for no text and for JSON null: the row's NULL); where the writer declines the text, the
 * text itself in a 1-tuple, for the reference to write. */
static PyObject *row_json(Str s) {
    if (s.n < 0) Py_RETURN_NONE;
    PyObject *out = NULL;
    int r = json_row_text(s.p, s.n, &out);
    if (r < 0) return NULL;
    if (r == 0) {
        PyObject *raw = text(s), *declined = raw ? PyTuple_Pack(1, raw) : NULL;
        Py_XDECREF(raw);
        return declined;
    }
    if (PyUnicode_GET_LENGTH(out) == 4 && PyUnicode_CompareWithASCIIString(out, "null") == 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

/* What the rows of a trace read of one span: (span id, parent id or None, kind, tool name, call id, arguments
 * and result as the row holds them (``row_json``), error, status code, start, end, GenAI-semconv, provider,
 * session key, weak session key). Kinds: 0 other, 1 llm, 2 tool, 3 agent. */
static PyObject *span_fact(const SpanS *x) {
    int tool = x->kind == K_TOOL;
    PyObject *items[15] = {NULL};
    items[0] = hex(x->sid, 8);
    items[1] = x->pid ? hex(x->pid, 8) : Py_NewRef(Py_None);
    items[2] = PyLong_FromLong(x->kind);
    items[3] = tool ? opt_text(x->tool) : Py_NewRef(Py_None);
    items[4] = tool ? opt_text(x->call_id) : Py_NewRef(Py_None);
    items[5] = tool ? row_json(x->arguments) : Py_NewRef(Py_None);
    items[6] = tool ? row_json(x->result) : Py_NewRef(Py_None);
    items[7] = error_of(x);
    items[8] = PyLong_FromLong(x->status_code);
    items[9] = PyLong_FromUnsignedLongLong(x->start);
    items[10] = PyLong_FromUnsignedLongLong(x->end);
    items[11] = Py_NewRef(x->genai ? Py_True : Py_False);
    items[12] = x->provider.n > 0 ? text(x->provider) : Py_NewRef(Py_None);
    items[13] = opt_text(x->session);
    items[14] = Py_NewRef(x->weak_session ? Py_True : Py_False);
    PyObject *out = PyTuple_New(15);
    for (int i = 0; i < 15; i++) {
        if (!items[i] || !out) {
            for (int j = 0; j < 15; j++) Py_XDECREF(items[j]);
            Py_XDECREF(out);
            if (!PyErr_Occurred()) PyErr_NoMemory();
            return NULL;
        }
    }
    for (int i = 0; i < 15; i++) PyTuple_SET_ITEM(out, i, items[i]);
    return out;
}

/* The trace's states, each span's facts for its rows in session order, and the service.version of the first span
 * (by start, then span id: the store's order) whose resource names one: a new (states, facts, version), Py_None
 * when it goes back, NULL on error. */
static PyObject *taken(TraceStates *self, const KeptTrace *t, PyObject *tid) {
    if (t->back) Py_RETURN_NONE;
    const SpanS **s = PyMem_Malloc((t->n ? t->n : 1) * sizeof *s);
    SpanS *spans = PyMem_Malloc((t->n ? t->n : 1) * sizeof *spans); /* in arrival order; s is sorted */
    if (!s || !spans) {
        PyMem_Free(s);
        PyMem_Free(spans);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < t->n; i++) unpack_span(t, &t->spans[i], &spans[i]), s[i] = &spans[i];
    PyObject *states = trace_states((PyObject **)&PyTuple_GET_ITEM(self->kit, 0), s, t->n, tid), *out = NULL;
    if (states && states != Py_None) {
        PyObject *facts = PyTuple_New((Py_ssize_t)t->n), *version = NULL;
        for (size_t i = 0; facts && i < t->n; i++) { /* s is in session order now (trace_states sorts it) */
            PyObject *f = span_fact(s[i]);
            if (!f) {
                Py_CLEAR(facts);
                break;
            }
            PyTuple_SET_ITEM(facts, (Py_ssize_t)i, f);
        }
        const SpanS *first = NULL; /* the resource version of the first span in (start, span id) order naming one */
        for (size_t i = 0; i < t->n; i++)
            if (spans[i].version.n > 0 && (!first || spans[i].start < first->start ||
                                           (spans[i].start == first->start && memcmp(spans[i].sid, first->sid, 8) < 0)))
                first = &spans[i];
        if (facts && first && !(version = text(first->version))) Py_CLEAR(facts);
        if (facts) out = PyTuple_Pack(3, states, facts, version ? version : Py_None);
        Py_XDECREF(facts);
        Py_XDECREF(version);
        Py_DECREF(states);
    } else
        out = states;
    PyMem_Free(s);
    PyMem_Free(spans);
    return out;
}

/* A trace's states made once from every span kept of it: None when it goes back (handed back, never seen, a
 * span id twice, a trace rule); let go either way, unless ``keep`` (a preview of an open trace). The readers
 * the kit calls run Python: what they read is detached from the object first (take) or the object refuses
 * every other call meanwhile (enter). */
static PyObject *take_or_peek(TraceStates *self, PyObject *tid, int keep) {
    if (enter_trace(self, tid) < 0) return NULL;
    Py_ssize_t slot = slot_of(self, tid, 0);
    if (slot == -2) return leave(self, NULL);
    if (slot < 0) return leave(self, Py_NewRef(Py_None));
    if (keep) return leave(self, taken(self, &self->slots[slot], tid));
    KeptTrace t;
    if (detach(self, tid, (size_t)slot, &t) < 0) return leave(self, NULL);
    PyObject *out = taken(self, &t, tid);
    trace_clear(&t);
    return leave(self, out);
}

static PyObject *TraceStates_take(TraceStates *self, PyObject *tid) { return take_or_peek(self, tid, 0); }
static PyObject *TraceStates_peek(TraceStates *self, PyObject *tid) { return take_or_peek(self, tid, 1); }

static PyObject *TraceStates_drop(TraceStates *self, PyObject *tid) {
    if (enter_trace(self, tid) < 0) return NULL;
    Py_ssize_t slot = slot_of(self, tid, 0);
    if (slot == -2) return leave(self, NULL);
    KeptTrace t;
    if (slot >= 0 && detach(self, tid, (size_t)slot, &t) < 0) return leave(self, NULL);
    if (slot >= 0) trace_clear(&t);
    return leave(self, PyBool_FromLong(slot >= 0));
}

static Py_ssize_t TraceStates_len(TraceStates *self) { return self->ready ? PyDict_GET_SIZE(self->slots_of) : 0; }

static PyObject *TraceStates_counts(TraceStates *self, PyObject *unused) {
    return Py_BuildValue("{snsnsn}", "bytes", self->bytes, "spans", self->spans, "handed_back", self->handed_back);
}

static PyMethodDef TraceStates_methods[] = {
    {"add", (PyCFunction)TraceStates_add, METH_O,
     "add(body) -> (handed back, spans kept, spans handed back, {trace id: session key}, {trace id: bytes}), or\n"
     "(None, why) when the whole body goes to Python. The session keys: of the traces kept whose spans in the body\n"
     "name one (a hint); the bytes: what keeping each trace's spans of the body took (as counts() counts them).\n"
     "Keeps every span of each trace it reads; a trace with a span it cannot read (now or in an earlier body) is\n"
     "handed back whole, and what was kept of it let go."},
    {"hand_back", (PyCFunction)TraceStates_hand_back, METH_O,
     "hand_back(trace_id): the records path reads this trace (e.g. a body the walk could not read)."},
    {"take", (PyCFunction)TraceStates_take, METH_O,
     "take(trace_id) -> (the trace's states in FACTS order, each span's facts for its rows in session order, the\n"
     "service.version of the first span by start and span id whose resource names one), or\n"
     "None (the records path reads it); let go either way."},
    {"peek", (PyCFunction)TraceStates_peek, METH_O, "peek(trace_id): take, keeping the trace."},
    {"drop", (PyCFunction)TraceStates_drop, METH_O, "drop(trace_id) -> whether anything was kept of it."},
    {"counts", (PyCFunction)TraceStates_counts, METH_NOARGS,
     "counts() -> {bytes, spans, handed_back}: what is kept (bytes as allocated, roughly) and traces handed back."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods TraceStates_sequence = {.sq_length = (lenfunc)TraceStates_len};

static PyTypeObject TraceStatesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "agentfunnel.collector._wire.TraceStates",
    .tp_basicsize = sizeof(TraceStates),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TraceStates(enabled, deny, deny_prefixes, user_keys, session_keys, scopes, value_marks, kit[, max_value_bytes]): GenAI-semconv traces'\n"
              "spans kept across requests (as genai_summaries reads them), each trace's states made once when taken.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TraceStates_init,
    .tp_dealloc = (destructor)TraceStates_dealloc,
    .tp_methods = TraceStates_methods,
    .tp_as_sequence = &TraceStates_sequence,
};

int add_trace_states(PyObject *module) {
    if (PyType_Ready(&TraceStatesType) < 0) return -1;
    return PyModule_AddObjectRef(module, "TraceStates", (PyObject *)&TraceStatesType);
}
