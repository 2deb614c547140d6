/*
 * agentfunnel.collector._wire: a compiled decoder for OTLP ExportTraceServiceRequest bodies.
 *
 * Why: the stock protobuf classes create a Python object per KeyValue/AnyValue and the reference
 * decoder then JSON-encodes the resulting dicts; on GenAI-shaped spans that is ~25-50 us per span.
 * This module walks the protobuf wire format once and writes the SpanBatch columns directly:
 * ids as lowercase hex, attributes/events/links as the exact JSON text that
 *   json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
 * produces for the Python values decode.py's reference path builds.
 *
 * Acceptance follows upb (the backend of the protobuf package), which the reference uses:
 *  - every known field is decoded and checked as upb would, including fields whose value we do
 *    not keep (proto3 strings must be valid UTF-8, sub-messages are parsed recursively);
 *  - a known field that arrives with a different wire type is an unknown field, not an error;
 *  - unknown fields of wire types 0, 1, 2, 5 are skipped; an unknown group (wire type 3) is
 *    skipped up to its matching end-group tag and counts as one nesting level; a stray or
 *    mismatched end-group tag, wire types 6/7, field number 0 (except inside an unknown group,
 *    whose contents upb only skips), a tag longer than 5 bytes or above 2^32-1, a varint longer
 *    than 10 bytes, a length longer than 5 bytes or of 2^31-1 and more, and anything running
 *    past the end of its enclosing message are errors;
 *  - nesting deeper than 100 messages/groups below the request is an error (upb's default);
 *  - a non-repeated message field seen twice is merged (parsing into the same message), a
 *    scalar seen twice keeps the last value, and a oneof member replaces the previous one
 *    (except that the same message member seen again is merged into it).
 *
 * Errors raise _wire.DecodeError (a ValueError) with the byte offset and the field.
 * The GIL is held throughout: Python objects are created as rows complete.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 100

/* Wire types. */
#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_SGROUP 3
#define WT_EGROUP 4
#define WT_I32 5
#define TAG(fn, wt) (((uint32_t)(fn) << 3) | (wt))

#define TRY(x) do { if ((x) < 0) return -1; } while (0)

static PyObject *DecodeError;
static const uint8_t EMPTY[1] = {0};

/* ------------------------------------------------------------------------------------------
 * Schema: every field upb knows in the messages we walk, so that fields we do not keep are
 * still validated exactly as upb validates them. Checked against the installed *_pb2
 * descriptors by tests/test_wire.py (see _schema()).
 */

enum { F_VARINT = 1, F_FIXED64, F_FIXED32, F_STRING, F_BYTES, F_MSG };

typedef struct Msg Msg;
typedef struct {
    uint32_t num;
    uint8_t type;
    const char *name;
    const Msg *sub;
} Field;
struct Msg {
    const char *name;
    const Field *fields;
    int nfields;
};

static const Msg M_Request, M_ResourceSpans, M_Resource, M_EntityRef, M_ScopeSpans, M_Scope,
    M_KeyValue, M_AnyValue, M_ArrayValue, M_KeyValueList, M_Span, M_Event, M_Link, M_Status;

#define MSG(var, pyname, ...)                                                   \
    static const Field var##_fields[] = {__VA_ARGS__};                          \
    static const Msg var = {pyname, var##_fields, (int)(sizeof(var##_fields) / sizeof(Field))};

MSG(M_Request, "ExportTraceServiceRequest",
    {1, F_MSG, "resource_spans", &M_ResourceSpans})
MSG(M_ResourceSpans, "ResourceSpans",
    {1, F_MSG, "resource", &M_Resource},
    {2, F_MSG, "scope_spans", &M_ScopeSpans},
    {3, F_STRING, "schema_url", NULL})
MSG(M_Resource, "Resource",
    {1, F_MSG, "attributes", &M_KeyValue},
    {2, F_VARINT, "dropped_attributes_count", NULL},
    {3, F_MSG, "entity_refs", &M_EntityRef})
MSG(M_EntityRef, "EntityRef",
    {1, F_STRING, "schema_url", NULL},
    {2, F_STRING, "type", NULL},
    {3, F_STRING, "id_keys", NULL},
    {4, F_STRING, "description_keys", NULL})
MSG(M_ScopeSpans, "ScopeSpans",
    {1, F_MSG, "scope", &M_Scope},
    {2, F_MSG, "spans", &M_Span},
    {3, F_STRING, "schema_url", NULL})
MSG(M_Scope, "InstrumentationScope",
    {1, F_STRING, "name", NULL},
    {2, F_STRING, "version", NULL},
    {3, F_MSG, "attributes", &M_KeyValue},
    {4, F_VARINT, "dropped_attributes_count", NULL})
MSG(M_KeyValue, "KeyValue",
    {1, F_STRING, "key", NULL},
    {2, F_MSG, "value", &M_AnyValue},
    {3, F_VARINT, "key_strindex", NULL})
MSG(M_AnyValue, "AnyValue",
    {1, F_STRING, "string_value", NULL},
    {2, F_VARINT, "bool_value", NULL},
    {3, F_VARINT, "int_value", NULL},
    {4, F_FIXED64, "double_value", NULL},
    {5, F_MSG, "array_value", &M_ArrayValue},
    {6, F_MSG, "kvlist_value", &M_KeyValueList},
    {7, F_BYTES, "bytes_value", NULL},
    {8, F_VARINT, "string_value_strindex", NULL})
MSG(M_ArrayValue, "ArrayValue",
    {1, F_MSG, "values", &M_AnyValue})
MSG(M_KeyValueList, "KeyValueList",
    {1, F_MSG, "values", &M_KeyValue})
MSG(M_Span, "Span",
    {1, F_BYTES, "trace_id", NULL},
    {2, F_BYTES, "span_id", NULL},
    {3, F_STRING, "trace_state", NULL},
    {4, F_BYTES, "parent_span_id", NULL},
    {5, F_STRING, "name", NULL},
    {6, F_VARINT, "kind", NULL},
    {7, F_FIXED64, "start_time_unix_nano", NULL},
    {8, F_FIXED64, "end_time_unix_nano", NULL},
    {9, F_MSG, "attributes", &M_KeyValue},
    {10, F_VARINT, "dropped_attributes_count", NULL},
    {11, F_MSG, "events", &M_Event},
    {12, F_VARINT, "dropped_events_count", NULL},
    {13, F_MSG, "links", &M_Link},
    {14, F_VARINT, "dropped_links_count", NULL},
    {15, F_MSG, "status", &M_Status},
    {16, F_FIXED32, "flags", NULL})
MSG(M_Event, "Span.Event",
    {1, F_FIXED64, "time_unix_nano", NULL},
    {2, F_STRING, "name", NULL},
    {3, F_MSG, "attributes", &M_KeyValue},
    {4, F_VARINT, "dropped_attributes_count", NULL})
MSG(M_Link, "Span.Link",
    {1, F_BYTES, "trace_id", NULL},
    {2, F_BYTES, "span_id", NULL},
    {3, F_STRING, "trace_state", NULL},
    {4, F_MSG, "attributes", &M_KeyValue},
    {5, F_VARINT, "dropped_attributes_count", NULL},
    {6, F_FIXED32, "flags", NULL})
MSG(M_Status, "Status",
    {2, F_STRING, "message", NULL},
    {3, F_VARINT, "code", NULL})

static const Msg *const ALL_MSGS[] = {
    &M_Request, &M_ResourceSpans, &M_Resource, &M_EntityRef, &M_ScopeSpans, &M_Scope, &M_KeyValue,
    &M_AnyValue, &M_ArrayValue, &M_KeyValueList, &M_Span, &M_Event, &M_Link, &M_Status,
};

static int field_wire_type(uint8_t type) {
    switch (type) {
    case F_VARINT: return WT_VARINT;
    case F_FIXED64: return WT_I64;
    case F_FIXED32: return WT_I32;
    default: return WT_LEN;
    }
}

static const char *field_name(const Msg *m, uint32_t fn) {
    for (int i = 0; i < m->nfields; i++)
        if (m->fields[i].num == fn) return m->fields[i].name;
    return "?";
}

/* ------------------------------------------------------------------------------------------
 * Growable byte buffer and the decoding context.
 */

typedef struct {
    char *d;
    size_t n, cap;
} Buf;

/* One key/value written into a JSON object under construction: offsets into its buffer. */
typedef struct {
    const uint8_t *key; /* raw key bytes in the body, for duplicate detection */
    size_t klen;
    size_t koff;        /* `"key":` starts here */
    size_t voff;        /* the value's JSON starts here ... */
    size_t end;         /* ... and ends here */
} Entry;

enum {
    C_TRACE_ID, C_SPAN_ID, C_PARENT, C_TRACE_STATE, C_FLAGS, C_NAME, C_KIND, C_START, C_END,
    C_STATUS_CODE, C_STATUS_MSG, C_SERVICE, C_SCOPE_NAME, C_SCOPE_VERSION, C_ATTRS, C_RES_ATTRS,
    C_EVENTS, C_LINKS, NCOLS
};
/* Must equal batches.SPAN_COLUMNS; decode.py checks before using this module. */
static const char *const COLUMN_NAMES[NCOLS] = {
    "trace_id", "span_id", "parent_span_id", "trace_state", "flags", "name", "kind", "start_ns",
    "end_ns", "status_code", "status_message", "service_name", "scope_name", "scope_version",
    "attributes", "resource_attributes", "events", "links",
};

typedef struct {
    const uint8_t *base; /* start of the body, for offsets in messages */
    int depth;
    Entry *ents;
    size_t nents, capents;
    uint32_t *scratch;
    size_t capscratch;
    Buf tmp, attrs, events, links, res;
    char err[300];
    /* output */
    PyObject **cols[NCOLS];
    size_t nrows, caprows;
    PyObject *kinds, *codes; /* tuples of str, borrowed */
    Py_ssize_t reject_count, reject_limit;
    PyObject *rejects;       /* list of (where, why) */
    Py_ssize_t bytes_values; /* bytes AnyValues met (made base64 text): redaction decodes them only when some are */
} Ctx;

static int fail(Ctx *c, const uint8_t *at, const char *fmt, ...) {
    if (PyErr_Occurred() || c->err[0]) return -1;
    int k = snprintf(c->err, sizeof c->err, "offset %zd: ", (Py_ssize_t)(at - c->base));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, sizeof c->err - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int buf_grow(Buf *b, size_t need) {
    if (b->cap - b->n >= need) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap - b->n < need) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    char *d = PyMem_Realloc(b->d, cap);
    if (!d) { PyErr_NoMemory(); return -1; }
    b->d = d;
    b->cap = cap;
    return 0;
}

static inline int buf_putc(Buf *b, char ch) {
    if (b->n == b->cap && buf_grow(b, 1) < 0) return -1;
    b->d[b->n++] = ch;
    return 0;
}

static inline int buf_put(Buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n && buf_grow(b, n) < 0) return -1;
    memcpy(b->d + b->n, s, n);
    b->n += n;
    return 0;
}
#define buf_lit(b, s) buf_put((b), (s), sizeof(s) - 1)

/* Replace b[off, off+oldlen) with src[0, n); src must not point into b. */
static int buf_splice(Buf *b, size_t off, size_t oldlen, const char *src, size_t n) {
    if (n > oldlen && buf_grow(b, n - oldlen) < 0) return -1;
    memmove(b->d + off + n, b->d + off + oldlen, b->n - off - oldlen);
    memcpy(b->d + off, src, n);
    b->n = b->n - oldlen + n;
    return 0;
}

static int enter(Ctx *c, const uint8_t *at) {
    if (++c->depth > MAX_DEPTH) return fail(c, at, "messages nested deeper than %d levels", MAX_DEPTH);
    return 0;
}
#define LEAVE(c) ((c)->depth--)

/* ------------------------------------------------------------------------------------------
 * Wire primitives. Every read is bounded by `end`, the end of the enclosing message.
 */

/* Up to 10 bytes; bits beyond 64 are dropped, as upb does. */
static int rd_varint(Ctx *c, const uint8_t **pp, const uint8_t *end, uint64_t *out, const uint8_t *at) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return fail(c, at, "truncated varint");
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return 0;
        }
    }
    return fail(c, at, "varint longer than 10 bytes");
}

/* upb: a tag is a varint of at most 5 bytes whose value fits in 32 bits. */
static inline int rd_tag(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *tag) {
    const uint8_t *p = *pp;
    if (*p < 0x80) { /* callers only call with p < end */
        *tag = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return fail(c, *pp, "truncated tag");
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (v > UINT32_MAX) return fail(c, *pp, "tag value above 2^32-1");
            *tag = (uint32_t)v;
            *pp = p;
            return 0;
        }
    }
    return fail(c, *pp, "tag longer than 5 bytes");
}

static inline int rd_fixed64(Ctx *c, const uint8_t **pp, const uint8_t *end, uint64_t *out, const uint8_t *at) {
    if (end - *pp < 8) return fail(c, at, "truncated fixed64 field");
    uint64_t v = 0;
    memcpy(&v, *pp, 8);
#if PY_BIG_ENDIAN
    v = __builtin_bswap64(v);
#endif
    *out = v;
    *pp += 8;
    return 0;
}

static inline int rd_fixed32(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *out, const uint8_t *at) {
    if (end - *pp < 4) return fail(c, at, "truncated fixed32 field");
    uint32_t v;
    memcpy(&v, *pp, 4);
#if PY_BIG_ENDIAN
    v = __builtin_bswap32(v);
#endif
    *out = v;
    *pp += 4;
    return 0;
}

/* The length of a length-delimited field: upb reads it as a varint of at most 5 bytes (unlike
 * values, which may take 10) and refuses 2^31-1 and above. */
static int rd_size(Ctx *c, const uint8_t **pp, const uint8_t *end, uint64_t *out, const uint8_t *at) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return fail(c, at, "truncated length");
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (v >= INT32_MAX) return fail(c, at, "length %llu is too large", (unsigned long long)v);
            *out = v;
            *pp = p;
            return 0;
        }
    }
    return fail(c, at, "length longer than 5 bytes");
}

/* A length-delimited field: its payload must lie inside the enclosing message. */
static inline int rd_len(Ctx *c, const uint8_t **pp, const uint8_t *end, const uint8_t **body,
                         size_t *n, const uint8_t *at, const Msg *m, uint32_t tag) {
    uint64_t len;
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        len = *p++;
    } else if (rd_size(c, &p, end, &len, at) < 0) {
        return -1;
    }
    if (len > (uint64_t)(end - p))
        return fail(c, at, "%s field %u (%s) has length %llu but only %zd bytes remain in the message",
                    m->name, tag >> 3, field_name(m, tag >> 3), (unsigned long long)len,
                    (Py_ssize_t)(end - p));
    *body = p;
    *n = (size_t)len;
    *pp = p + len;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * UTF-8 (strict, as upb's utf8_range and Python's decoder: no overlongs, no surrogates,
 * nothing above U+10FFFF) and JSON string escaping as json's encode_basestring does it.
 */

/* Length of the valid UTF-8 sequence at s (lead byte >= 0x80), or 0 if invalid. */
static inline int utf8_seq(const uint8_t *s, size_t left) {
    uint8_t b0 = s[0];
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        return (left >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3 || (s[2] & 0xC0) != 0x80) return 0;
        uint8_t b1 = s[1];
        if (b0 == 0xE0) return (b1 >= 0xA0 && b1 <= 0xBF) ? 3 : 0;
        if (b0 == 0xED) return (b1 >= 0x80 && b1 <= 0x9F) ? 3 : 0; /* no surrogates */
        return ((b1 & 0xC0) == 0x80) ? 3 : 0;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        uint8_t b1 = s[1];
        if (b0 == 0xF0) return (b1 >= 0x90 && b1 <= 0xBF) ? 4 : 0;
        if (b0 == 0xF4) return (b1 >= 0x80 && b1 <= 0x8F) ? 4 : 0;
        return ((b1 & 0xC0) == 0x80) ? 4 : 0;
    }
    return 0;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* eight ASCII bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        while (i < n && s[i] < 0x80) i++;
        if (i >= n) break;
        int k = utf8_seq(s + i, n - i);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

static int check_utf8(Ctx *c, const uint8_t *s, size_t n, const uint8_t *at, const Msg *m, uint32_t fn) {
    if (!utf8_valid(s, n))
        return fail(c, at, "invalid UTF-8 in string field %s.%s", m->name, field_name(m, fn));
    return 0;
}

/* 0: copy as is; 1: escape (" \ and < 0x20); 2: start of a multi-byte sequence. */
static uint8_t JSON_CLASS[256];
static const char HEX[] = "0123456789abcdef";

/* Nonzero if any of the 8 bytes in w needs attention in a JSON string: >= 0x80, < 0x20, '"' or
 * '\\' (the classic has-zero-byte bit trick; a false positive only sends us to the byte loop). */
static inline uint64_t json_special8(uint64_t w) {
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t q = w ^ (ones * '"'), bs = w ^ (ones * '\\');
    return (w | ((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & high;
}

/* Write s as a JSON string (validating UTF-8 on the way). */
static int emit_str(Ctx *c, Buf *b, const uint8_t *s, size_t n, const uint8_t *at, const Msg *m, uint32_t fn) {
    if (buf_grow(b, n + 2) < 0) return -1;
    char *o = b->d + b->n;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j + 8 <= n) { /* plain ASCII eight bytes at a time */
            uint64_t w;
            memcpy(&w, s + j, 8);
            if (json_special8(w)) break;
            j += 8;
        }
        while (j < n && JSON_CLASS[s[j]] == 0) j++;
        memcpy(o, s + i, j - i);
        o += j - i;
        i = j;
        if (i >= n) break;
        uint8_t ch = s[i];
        if (JSON_CLASS[ch] == 1) {
            /* at most 6 bytes out for 1 in: make room for the worst case of the rest */
            b->n = (size_t)(o - b->d);
            if (buf_grow(b, (n - i) + 6 + 1) < 0) return -1;
            o = b->d + b->n;
            *o++ = '\\';
            switch (ch) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = HEX[ch >> 4]; *o++ = HEX[ch & 15];
            }
            i++;
        } else {
            int k = utf8_seq(s + i, n - i);
            if (!k) {
                b->n = (size_t)(o - b->d);
                return fail(c, at, "invalid UTF-8 in string field %s.%s", m->name, field_name(m, fn));
            }
            memcpy(o, s + i, (size_t)k);
            o += k;
            i += (size_t)k;
        }
    }
    *o++ = '"';
    b->n = (size_t)(o - b->d);
    return 0;
}

static char *put_u64(char *o, uint64_t v) {
    char t[20];
    int i = 0;
    do {
        t[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (i) *o++ = t[--i];
    return o;
}

static int emit_u64(Buf *b, uint64_t v) {
    if (buf_grow(b, 21) < 0) return -1;
    b->n = (size_t)(put_u64(b->d + b->n, v) - b->d);
    return 0;
}

static int emit_i64(Buf *b, int64_t v) {
    if (buf_grow(b, 21) < 0) return -1;
    char *o = b->d + b->n;
    if (v < 0) {
        *o++ = '-';
        o = put_u64(o, (uint64_t)0 - (uint64_t)v);
    } else {
        o = put_u64(o, (uint64_t)v);
    }
    b->n = (size_t)(o - b->d);
    return 0;
}

/* float.__repr__ for finite values (what json writes); str(x) as a JSON string otherwise. */
static int emit_double(Buf *b, uint64_t bits) {
    double d;
    memcpy(&d, &bits, 8);
    if (isnan(d)) return buf_lit(b, "\"nan\"");
    if (isinf(d)) return d > 0 ? buf_lit(b, "\"inf\"") : buf_lit(b, "\"-inf\"");
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return -1;
    int r = buf_put(b, s, strlen(s));
    PyMem_Free(s);
    return r;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int emit_base64(Buf *b, const uint8_t *s, size_t n) {
    if (buf_grow(b, (n + 2) / 3 * 4 + 2) < 0) return -1;
    char *o = b->d + b->n;
    *o++ = '"';
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *o++ = B64[v >> 18]; *o++ = B64[(v >> 12) & 63]; *o++ = B64[(v >> 6) & 63]; *o++ = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *o++ = B64[v >> 18]; *o++ = B64[(v >> 12) & 63]; *o++ = '='; *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        *o++ = B64[v >> 18]; *o++ = B64[(v >> 12) & 63]; *o++ = B64[(v >> 6) & 63]; *o++ = '=';
    }
    *o++ = '"';
    b->n = (size_t)(o - b->d);
    return 0;
}

static int emit_hex(Buf *b, const uint8_t *s, size_t n) {
    if (buf_grow(b, 2 * n + 2) < 0) return -1;
    char *o = b->d + b->n;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        *o++ = HEX[s[i] >> 4];
        *o++ = HEX[s[i] & 15];
    }
    *o++ = '"';
    b->n = (size_t)(o - b->d);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Skipping and validating fields we do not keep.
 */

static int skip_value(Ctx *c, uint32_t tag, const uint8_t **pp, const uint8_t *end, const uint8_t *at);

/* An unknown group: fields up to the end-group tag with the same number, one nesting level
 * deeper. upb skips its contents without looking at them, so field number 0 is accepted in
 * there (it is an error anywhere else). */
static int skip_group(Ctx *c, uint32_t fn, const uint8_t **pp, const uint8_t *end, const uint8_t *at) {
    TRY(enter(c, at));
    const uint8_t *p = *pp;
    for (;;) {
        if (p >= end) return fail(c, at, "group (field %u) has no end-group tag", fn);
        const uint8_t *tp = p;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if ((tag & 7) == WT_EGROUP) {
            if ((tag >> 3) != fn)
                return fail(c, tp, "end-group tag for field %u closes group field %u", tag >> 3, fn);
            break;
        }
        TRY(skip_value(c, tag, &p, end, tp));
    }
    LEAVE(c);
    *pp = p;
    return 0;
}

static int skip_value(Ctx *c, uint32_t tag, const uint8_t **pp, const uint8_t *end, const uint8_t *at) {
    uint32_t fn = tag >> 3, wt = tag & 7;
    switch (wt) {
    case WT_VARINT: {
        uint64_t v = 0;
        return rd_varint(c, pp, end, &v, at);
    }
    case WT_I64:
        if (end - *pp < 8) return fail(c, at, "truncated fixed64 field %u", fn);
        *pp += 8;
        return 0;
    case WT_I32:
        if (end - *pp < 4) return fail(c, at, "truncated fixed32 field %u", fn);
        *pp += 4;
        return 0;
    case WT_LEN: {
        uint64_t len;
        TRY(rd_size(c, pp, end, &len, at));
        if (len > (uint64_t)(end - *pp))
            return fail(c, at, "field %u has length %llu but only %zd bytes remain in the message", fn,
                        (unsigned long long)len, (Py_ssize_t)(end - *pp));
        *pp += len;
        return 0;
    }
    case WT_SGROUP:
        return skip_group(c, fn, pp, end, at);
    case WT_EGROUP:
        return fail(c, at, "end-group tag (field %u) outside its group", fn);
    default:
        return fail(c, at, "invalid wire type %u (field %u)", wt, fn);
    }
}

/* An unknown field of a message (or a known one with an unexpected wire type). */
static int skip_unknown(Ctx *c, uint32_t tag, const uint8_t **pp, const uint8_t *end, const uint8_t *at) {
    if ((tag & 7) != WT_EGROUP && (tag >> 3) == 0) return fail(c, at, "field number 0");
    return skip_value(c, tag, pp, end, at);
}

static int validate_msg(Ctx *c, const Msg *m, const uint8_t *p, const uint8_t *end);

/* A field of message m that the caller does not keep: validate it as upb would. A known field
 * with an unexpected wire type is an unknown field to upb (kept as unknown bytes, no error). */
static int skip_field(Ctx *c, const Msg *m, uint32_t tag, const uint8_t **pp, const uint8_t *end, const uint8_t *at) {
    uint32_t fn = tag >> 3;
    const Field *f = NULL;
    for (int i = 0; i < m->nfields; i++)
        if (m->fields[i].num == fn) { f = &m->fields[i]; break; }
    if (!f || (tag & 7) != (uint32_t)field_wire_type(f->type)) return skip_unknown(c, tag, pp, end, at);
    switch (f->type) {
    case F_VARINT: {
        uint64_t v = 0;
        return rd_varint(c, pp, end, &v, at);
    }
    case F_FIXED64: {
        uint64_t v = 0;
        return rd_fixed64(c, pp, end, &v, at);
    }
    case F_FIXED32: {
        uint32_t v;
        return rd_fixed32(c, pp, end, &v, at);
    }
    default: {
        const uint8_t *s = NULL;
        size_t n = 0;
        TRY(rd_len(c, pp, end, &s, &n, at, m, tag));
        if (f->type == F_STRING) return check_utf8(c, s, n, at, m, fn);
        if (f->type == F_MSG) {
            TRY(enter(c, at));
            TRY(validate_msg(c, f->sub, s, s + n));
            LEAVE(c);
        }
        return 0;
    }
    }
}

static int validate_msg(Ctx *c, const Msg *m, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        const uint8_t *tp = p;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        TRY(skip_field(c, m, tag, &p, end, tp));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * AnyValue → JSON, streamed into a buffer.
 *
 * A value is written where it starts (a->start) as soon as its field is read. Because the
 * oneof may be set again later in the same message, or in a later occurrence of the same
 * field (messages seen twice are merged), a new member truncates the buffer back to
 * a->start; an array or kvlist member seen again while already current keeps appending,
 * which is exactly protobuf's merge of the repeated `values`.
 */

enum { V_NONE, V_STRING, V_BOOL, V_INT, V_DOUBLE, V_ARRAY, V_KVLIST, V_BYTES, V_STRINDEX };

typedef struct {
    int kind;
    size_t start;        /* where this value's JSON begins in its buffer */
    const uint8_t *s;    /* V_STRING, V_BYTES: the raw value (for service.name) */
    size_t slen;
    uint64_t bits;       /* V_DOUBLE: the value (for service.name) */
    size_t nelem;        /* V_ARRAY: elements written */
    size_t ebase;        /* V_KVLIST: its first entry on the entry stack */
} AnyState;

static int kv_entry(Ctx *c, Buf *b, size_t ebase, const uint8_t *p, const uint8_t *end,
                    const uint8_t **key_out, size_t *klen_out, AnyState *v_out);
static int map_finish(Ctx *c, Buf *b, size_t ebase, size_t start);
static int any_finish(Ctx *c, Buf *b, AnyState *a);

static inline void any_init(AnyState *a, Buf *b) {
    a->kind = V_NONE;
    a->start = b->n;
}

static inline void any_set(Ctx *c, Buf *b, AnyState *a, int kind) {
    if (a->kind == V_KVLIST) c->nents = a->ebase;
    b->n = a->start;
    a->kind = kind;
}

static int any_feed(Ctx *c, Buf *b, AnyState *a, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        uint64_t v = 0;
        TRY(rd_tag(c, &p, end, &tag));
        switch (tag) {
        case TAG(1, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_AnyValue, tag));
            any_set(c, b, a, V_STRING);
            a->s = s;
            a->slen = n;
            TRY(emit_str(c, b, s, n, tp, &M_AnyValue, 1));
            break;
        case TAG(2, WT_VARINT):
            TRY(rd_varint(c, &p, end, &v, tp));
            any_set(c, b, a, V_BOOL);
            TRY(v ? buf_lit(b, "true") : buf_lit(b, "false"));
            break;
        case TAG(3, WT_VARINT):
            TRY(rd_varint(c, &p, end, &v, tp));
            any_set(c, b, a, V_INT);
            TRY(emit_i64(b, (int64_t)v));
            break;
        case TAG(4, WT_I64):
            TRY(rd_fixed64(c, &p, end, &v, tp));
            any_set(c, b, a, V_DOUBLE);
            a->bits = v;
            TRY(emit_double(b, v));
            break;
        case TAG(5, WT_LEN): {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_AnyValue, tag));
            if (a->kind != V_ARRAY) {
                any_set(c, b, a, V_ARRAY);
                a->nelem = 0;
                TRY(buf_putc(b, '['));
            }
            TRY(enter(c, tp));
            const uint8_t *q = s, *qend = s + n;
            while (q < qend) { /* ArrayValue */
                const uint8_t *tq = q, *es = NULL;
                size_t en = 0;
                uint32_t etag = 0;
                TRY(rd_tag(c, &q, qend, &etag));
                if (etag == TAG(1, WT_LEN)) {
                    TRY(rd_len(c, &q, qend, &es, &en, tq, &M_ArrayValue, etag));
                    TRY(enter(c, tq));
                    if (a->nelem++) TRY(buf_putc(b, ','));
                    AnyState e;
                    any_init(&e, b);
                    TRY(any_feed(c, b, &e, es, es + en));
                    TRY(any_finish(c, b, &e));
                    LEAVE(c);
                } else {
                    TRY(skip_field(c, &M_ArrayValue, etag, &q, qend, tq));
                }
            }
            LEAVE(c);
            break;
        }
        case TAG(6, WT_LEN): {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_AnyValue, tag));
            if (a->kind != V_KVLIST) {
                any_set(c, b, a, V_KVLIST);
                a->ebase = c->nents;
                TRY(buf_putc(b, '{'));
            }
            TRY(enter(c, tp));
            const uint8_t *q = s, *qend = s + n;
            while (q < qend) { /* KeyValueList */
                const uint8_t *tq = q, *es = NULL;
                size_t en = 0;
                uint32_t etag = 0;
                TRY(rd_tag(c, &q, qend, &etag));
                if (etag == TAG(1, WT_LEN)) {
                    TRY(rd_len(c, &q, qend, &es, &en, tq, &M_KeyValueList, etag));
                    TRY(enter(c, tq));
                    TRY(kv_entry(c, b, a->ebase, es, es + en, NULL, NULL, NULL));
                    LEAVE(c);
                } else {
                    TRY(skip_field(c, &M_KeyValueList, etag, &q, qend, tq));
                }
            }
            LEAVE(c);
            break;
        }
        case TAG(7, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_AnyValue, tag));
            any_set(c, b, a, V_BYTES);
            a->s = s;
            a->slen = n;
            c->bytes_values++;
            TRY(emit_base64(b, s, n));
            break;
        case TAG(8, WT_VARINT):
            /* string_value_strindex: the reference maps a value it does not know to None */
            TRY(rd_varint(c, &p, end, &v, tp));
            any_set(c, b, a, V_STRINDEX);
            break;
        default:
            TRY(skip_field(c, &M_AnyValue, tag, &p, end, tp));
        }
    }
    return 0;
}

static int any_finish(Ctx *c, Buf *b, AnyState *a) {
    switch (a->kind) {
    case V_NONE:
    case V_STRINDEX:
        return buf_lit(b, "null");
    case V_ARRAY:
        return buf_putc(b, ']');
    case V_KVLIST:
        return map_finish(c, b, a->ebase, a->start);
    default:
        return 0; /* scalars are written when read */
    }
}

/* ------------------------------------------------------------------------------------------
 * JSON objects from repeated KeyValue, with Python dict semantics for duplicate keys: a key
 * keeps the position of its first occurrence and the value of its last.
 */

static int push_entry(Ctx *c, const uint8_t *key, size_t klen, size_t koff, size_t voff, size_t end) {
    if (c->nents == c->capents) {
        size_t cap = c->capents ? 2 * c->capents : 64;
        Entry *e = PyMem_Realloc(c->ents, cap * sizeof(Entry));
        if (!e) { PyErr_NoMemory(); return -1; }
        c->ents = e;
        c->capents = cap;
    }
    Entry *e = &c->ents[c->nents++];
    e->key = key;
    e->klen = klen;
    e->koff = koff;
    e->voff = voff;
    e->end = end;
    return 0;
}

static inline int same_key(const Entry *a, const Entry *b) {
    return a->klen == b->klen && memcmp(a->key, b->key, a->klen) == 0;
}

/* first[i] = index of the first entry whose key equals entry i's; returns 1 if any repeats. */
static int find_repeats(Ctx *c, const Entry *e, size_t n, uint32_t **first_out) {
    size_t tsize = 0;
    if (n > 16) {
        tsize = 32;
        while (tsize < 2 * n) tsize *= 2;
    }
    size_t need = 2 * n + tsize;
    if (need > c->capscratch) {
        uint32_t *s = PyMem_Realloc(c->scratch, need * sizeof(uint32_t));
        if (!s) { PyErr_NoMemory(); return -1; }
        c->scratch = s;
        c->capscratch = need;
    }
    uint32_t *first = c->scratch;
    int any = 0;
    *first_out = first;
    if (n <= 16) {
        for (size_t i = 0; i < n; i++) {
            first[i] = (uint32_t)i;
            for (size_t j = 0; j < i; j++) {
                if (first[j] == j && same_key(&e[i], &e[j])) {
                    first[i] = (uint32_t)j;
                    any = 1;
                    break;
                }
            }
        }
        return any;
    }
    uint32_t *table = c->scratch + 2 * n, mask = (uint32_t)(tsize - 1);
    memset(table, 0xff, tsize * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t h = 2166136261u; /* FNV-1a */
        for (size_t k = 0; k < e[i].klen; k++) h = (h ^ e[i].key[k]) * 16777619u;
        h &= mask;
        first[i] = (uint32_t)i;
        while (table[h] != UINT32_MAX) {
            if (same_key(&e[i], &e[table[h]])) {
                first[i] = table[h];
                any = 1;
                break;
            }
            h = (h + 1) & mask;
        }
        if (first[i] == i) table[h] = (uint32_t)i;
    }
    return any;
}

/* Close the object that starts at b[start] ('{') and whose entries are ents[ebase:]. */
static int map_finish(Ctx *c, Buf *b, size_t ebase, size_t start) {
    size_t n = c->nents - ebase;
    if (n >= 2) {
        uint32_t *first;
        int any = find_repeats(c, c->ents + ebase, n, &first);
        TRY(any);
        if (any) {
            const Entry *e = c->ents + ebase;
            uint32_t *last = first + n;
            for (size_t i = 0; i < n; i++) last[first[i]] = (uint32_t)i;
            Buf *t = &c->tmp;
            t->n = 0;
            TRY(buf_putc(t, '{'));
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if (first[i] != i) continue;
                const Entry *l = &e[last[i]];
                if (k++) TRY(buf_putc(t, ','));
                TRY(buf_put(t, b->d + e[i].koff, e[i].voff - e[i].koff));
                TRY(buf_put(t, b->d + l->voff, l->end - l->voff));
            }
            TRY(buf_putc(t, '}'));
            c->nents = ebase;
            return buf_splice(b, start, b->n - start, t->d, t->n);
        }
    }
    c->nents = ebase;
    return buf_putc(b, '}');
}

/* One KeyValue as `"key":value` (with a leading comma unless first) in the object whose
 * entries start at ebase. The key is usually on the wire before the value, so it is written
 * first; when it is not (or comes twice after the value) it is spliced in afterwards. */
static int kv_entry(Ctx *c, Buf *b, size_t ebase, const uint8_t *p, const uint8_t *end,
                    const uint8_t **key_out, size_t *klen_out, AnyState *v_out) {
    if (c->nents > ebase) TRY(buf_putc(b, ','));
    size_t koff = b->n;
    const uint8_t *key = EMPTY;
    size_t klen = 0;
    int key_written = 0, vstarted = 0, respell = 0;
    AnyState v;
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(1, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_KeyValue, tag));
            if (!vstarted) {
                b->n = koff;
                TRY(emit_str(c, b, s, n, tp, &M_KeyValue, 1));
                TRY(buf_putc(b, ':'));
                key_written = 1;
            } else {
                TRY(check_utf8(c, s, n, tp, &M_KeyValue, 1));
                respell = 1;
            }
            key = s;
            klen = n;
        } else if (tag == TAG(2, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_KeyValue, tag));
            TRY(enter(c, tp));
            if (!vstarted) {
                any_init(&v, b);
                vstarted = 1;
            }
            TRY(any_feed(c, b, &v, s, s + n));
            LEAVE(c);
        } else {
            TRY(skip_field(c, &M_KeyValue, tag, &p, end, tp));
        }
    }
    if (!vstarted) any_init(&v, b);
    TRY(any_finish(c, b, &v));
    size_t voff = v.start;
    if (!key_written || respell) {
        Buf *t = &c->tmp;
        t->n = 0;
        TRY(emit_str(c, t, key, klen, end, &M_KeyValue, 1));
        TRY(buf_putc(t, ':'));
        TRY(buf_splice(b, koff, voff - koff, t->d, t->n));
        voff = koff + t->n;
    }
    TRY(push_entry(c, key, klen, koff, voff, b->n));
    if (key_out) {
        *key_out = key;
        *klen_out = klen;
        *v_out = v;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Events and links: `{"name":..,"time_unix_nano":..,"attributes":{..}}` and
 * `{"trace_id":..,"span_id":..,["trace_state":..,]"attributes":{..}}`, list items of their
 * span's column. Their scalar fields may follow the attributes on the wire, so the attributes
 * are written first and the head is spliced in front once the message is read.
 */

static int event_entry(Ctx *c, Buf *b, int first, const uint8_t *p, const uint8_t *end, const uint8_t *at) {
    TRY(buf_putc(b, first ? '[' : ','));
    size_t head = b->n, ebase = c->nents;
    const uint8_t *name = EMPTY;
    size_t namelen = 0;
    uint64_t t = 0;
    TRY(buf_putc(b, '{'));
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        switch (tag) {
        case TAG(1, WT_I64):
            TRY(rd_fixed64(c, &p, end, &t, tp));
            break;
        case TAG(2, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Event, tag));
            TRY(check_utf8(c, s, n, tp, &M_Event, 2));
            name = s;
            namelen = n;
            break;
        case TAG(3, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Event, tag));
            TRY(enter(c, tp));
            TRY(kv_entry(c, b, ebase, s, s + n, NULL, NULL, NULL));
            LEAVE(c);
            break;
        default:
            TRY(skip_field(c, &M_Event, tag, &p, end, tp));
        }
    }
    TRY(map_finish(c, b, ebase, head));
    TRY(buf_putc(b, '}'));
    Buf *h = &c->tmp;
    h->n = 0;
    TRY(buf_lit(h, "{\"name\":"));
    TRY(emit_str(c, h, name, namelen, at, &M_Event, 2));
    TRY(buf_lit(h, ",\"time_unix_nano\":"));
    TRY(emit_u64(h, t));
    TRY(buf_lit(h, ",\"attributes\":"));
    return buf_splice(b, head, 0, h->d, h->n);
}

static int link_entry(Ctx *c, Buf *b, int first, const uint8_t *p, const uint8_t *end, const uint8_t *at) {
    TRY(buf_putc(b, first ? '[' : ','));
    size_t head = b->n, ebase = c->nents;
    const uint8_t *tid = EMPTY, *sid = EMPTY, *ts = EMPTY;
    size_t tidn = 0, sidn = 0, tsn = 0;
    TRY(buf_putc(b, '{'));
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        switch (tag) {
        case TAG(1, WT_LEN):
            TRY(rd_len(c, &p, end, &tid, &tidn, tp, &M_Link, tag));
            break;
        case TAG(2, WT_LEN):
            TRY(rd_len(c, &p, end, &sid, &sidn, tp, &M_Link, tag));
            break;
        case TAG(3, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Link, tag));
            TRY(check_utf8(c, s, n, tp, &M_Link, 3));
            ts = s;
            tsn = n;
            break;
        case TAG(4, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Link, tag));
            TRY(enter(c, tp));
            TRY(kv_entry(c, b, ebase, s, s + n, NULL, NULL, NULL));
            LEAVE(c);
            break;
        default:
            TRY(skip_field(c, &M_Link, tag, &p, end, tp));
        }
    }
    TRY(map_finish(c, b, ebase, head));
    TRY(buf_putc(b, '}'));
    Buf *h = &c->tmp;
    h->n = 0;
    TRY(buf_lit(h, "{\"trace_id\":"));
    TRY(emit_hex(h, tid, tidn));
    TRY(buf_lit(h, ",\"span_id\":"));
    TRY(emit_hex(h, sid, sidn));
    if (tsn) { /* the reference adds trace_state only when it is not empty */
        TRY(buf_lit(h, ",\"trace_state\":"));
        TRY(emit_str(c, h, ts, tsn, at, &M_Link, 3));
    }
    TRY(buf_lit(h, ",\"attributes\":"));
    return buf_splice(b, head, 0, h->d, h->n);
}

/* ------------------------------------------------------------------------------------------
 * Python objects for the columns.
 */

static PyObject *str_of(const uint8_t *s, size_t n) {
    return PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, NULL); /* validated already */
}

static PyObject *str_or_none(const uint8_t *s, size_t n) {
    if (!n) Py_RETURN_NONE;
    return str_of(s, n);
}

static PyObject *hex_of(const uint8_t *s, size_t n) {
    PyObject *u = PyUnicode_New((Py_ssize_t)(2 * n), 127);
    if (!u) return NULL;
    Py_UCS1 *o = PyUnicode_1BYTE_DATA(u);
    for (size_t i = 0; i < n; i++) {
        *o++ = (Py_UCS1)HEX[s[i] >> 4];
        *o++ = (Py_UCS1)HEX[s[i] & 15];
    }
    return u;
}

static int all_zero(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i]) return 0;
    return 1;
}

static int add_row(Ctx *c, PyObject **row) {
    if (c->nrows == c->caprows) {
        size_t cap = c->caprows ? 2 * c->caprows : 256;
        for (int k = 0; k < NCOLS; k++) {
            PyObject **v = PyMem_Realloc(c->cols[k], cap * sizeof(PyObject *));
            if (!v) { PyErr_NoMemory(); return -1; }
            c->cols[k] = v;
        }
        c->caprows = cap;
    }
    for (int k = 0; k < NCOLS; k++) c->cols[k][c->nrows] = row[k]; /* steals */
    c->nrows++;
    return 0;
}

/* What every span of one ResourceSpans/ScopeSpans shares (new references). */
typedef struct {
    PyObject *res_json, *service, *scope_name, *scope_version;
} Shared;

typedef struct {
    const uint8_t *tid, *sid, *pid, *ts, *name, *msg;
    size_t tidn, sidn, pidn, tsn, namen, msgn;
    int32_t kind, code;
    uint64_t start, end;
    uint32_t flags;
} SpanF;

static int reject(Ctx *c, size_t ri, size_t si, size_t pi, PyObject *why) {
    if (!why) return -1;
    c->reject_count++;
    if (PyList_GET_SIZE(c->rejects) >= c->reject_limit) {
        Py_DECREF(why);
        return 0;
    }
    PyObject *where = PyUnicode_FromFormat("resourceSpans[%zu].scopeSpans[%zu].spans[%zu]", ri, si, pi);
    if (!where) {
        Py_DECREF(why);
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, where, why);
    Py_DECREF(where);
    Py_DECREF(why);
    if (!pair) return -1;
    int r = PyList_Append(c->rejects, pair);
    Py_DECREF(pair);
    return r;
}

/* The checks and messages of batches.hex_id and SpanBatch.add, in the same order. */
static PyObject *id_problem(const char *what, const uint8_t *s, size_t n, size_t size) {
    if (!n) return PyUnicode_FromFormat("%s is empty", what);
    if (n != size) return PyUnicode_FromFormat("%s has %zu bytes, expected %zu", what, n, size);
    if (all_zero(s, n)) return PyUnicode_FromFormat("%s is all zeros", what);
    return NULL;
}

static int emit_span(Ctx *c, const Shared *sh, const SpanF *f, size_t ri, size_t si, size_t pi,
                     size_t nev, size_t nln) {
    PyObject *why;
    if ((why = id_problem("trace_id", f->tid, f->tidn, 16)) || (why = id_problem("span_id", f->sid, f->sidn, 8)))
        return reject(c, ri, si, pi, why);
    if (PyErr_Occurred()) return -1;
    if (f->pidn && f->pidn != 8)
        return reject(c, ri, si, pi, PyUnicode_FromFormat("parent_span_id has %zu bytes, expected 8", f->pidn));
    if (f->kind < 0 || f->kind >= PyTuple_GET_SIZE(c->kinds))
        return reject(c, ri, si, pi, PyUnicode_FromFormat("kind %d is not a SpanKind", (int)f->kind));
    if (f->code < 0 || f->code >= PyTuple_GET_SIZE(c->codes))
        return reject(c, ri, si, pi, PyUnicode_FromFormat("status.code %d is not a StatusCode", (int)f->code));

    PyObject *row[NCOLS] = {0};
    row[C_TRACE_ID] = hex_of(f->tid, f->tidn);
    row[C_SPAN_ID] = hex_of(f->sid, f->sidn);
    if (f->pidn && !all_zero(f->pid, f->pidn)) {
        row[C_PARENT] = hex_of(f->pid, f->pidn);
    } else {
        row[C_PARENT] = Py_NewRef(Py_None);
    }
    row[C_TRACE_STATE] = str_or_none(f->ts, f->tsn);
    row[C_FLAGS] = PyLong_FromUnsignedLong(f->flags);
    row[C_NAME] = str_of(f->name, f->namen);
    row[C_KIND] = Py_NewRef(PyTuple_GET_ITEM(c->kinds, f->kind));
    row[C_START] = PyLong_FromUnsignedLongLong(f->start);
    row[C_END] = PyLong_FromUnsignedLongLong(f->end);
    row[C_STATUS_CODE] = Py_NewRef(PyTuple_GET_ITEM(c->codes, f->code));
    row[C_STATUS_MSG] = str_or_none(f->msg, f->msgn);
    row[C_SERVICE] = Py_NewRef(sh->service);
    row[C_SCOPE_NAME] = Py_NewRef(sh->scope_name);
    row[C_SCOPE_VERSION] = Py_NewRef(sh->scope_version);
    row[C_ATTRS] = str_of((const uint8_t *)c->attrs.d, c->attrs.n);
    row[C_RES_ATTRS] = Py_NewRef(sh->res_json);
    row[C_EVENTS] = nev ? str_of((const uint8_t *)c->events.d, c->events.n) : Py_NewRef(Py_None);
    row[C_LINKS] = nln ? str_of((const uint8_t *)c->links.d, c->links.n) : Py_NewRef(Py_None);
    for (int k = 0; k < NCOLS; k++) {
        if (!row[k]) {
            for (int j = 0; j < NCOLS; j++) Py_XDECREF(row[j]);
            return -1;
        }
    }
    if (add_row(c, row) < 0) {
        for (int j = 0; j < NCOLS; j++) Py_DECREF(row[j]);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The message tree.
 */

static int do_span(Ctx *c, const Shared *sh, size_t ri, size_t si, size_t pi, const uint8_t *p, const uint8_t *end) {
    SpanF f;
    memset(&f, 0, sizeof f);
    f.tid = f.sid = f.pid = f.ts = f.name = f.msg = EMPTY;
    Buf *ab = &c->attrs, *eb = &c->events, *lb = &c->links;
    size_t aebase = c->nents, nev = 0, nln = 0;
    ab->n = eb->n = lb->n = 0;
    TRY(buf_putc(ab, '{'));
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        uint64_t v = 0;
        TRY(rd_tag(c, &p, end, &tag));
        switch (tag) {
        case TAG(1, WT_LEN):
            TRY(rd_len(c, &p, end, &f.tid, &f.tidn, tp, &M_Span, tag));
            break;
        case TAG(2, WT_LEN):
            TRY(rd_len(c, &p, end, &f.sid, &f.sidn, tp, &M_Span, tag));
            break;
        case TAG(3, WT_LEN):
            TRY(rd_len(c, &p, end, &f.ts, &f.tsn, tp, &M_Span, tag));
            TRY(check_utf8(c, f.ts, f.tsn, tp, &M_Span, 3));
            break;
        case TAG(4, WT_LEN):
            TRY(rd_len(c, &p, end, &f.pid, &f.pidn, tp, &M_Span, tag));
            break;
        case TAG(5, WT_LEN):
            TRY(rd_len(c, &p, end, &f.name, &f.namen, tp, &M_Span, tag));
            TRY(check_utf8(c, f.name, f.namen, tp, &M_Span, 5));
            break;
        case TAG(6, WT_VARINT):
            TRY(rd_varint(c, &p, end, &v, tp));
            f.kind = (int32_t)(uint32_t)v; /* enum: int32, upper bits dropped as upb does */
            break;
        case TAG(7, WT_I64):
            TRY(rd_fixed64(c, &p, end, &f.start, tp));
            break;
        case TAG(8, WT_I64):
            TRY(rd_fixed64(c, &p, end, &f.end, tp));
            break;
        case TAG(9, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Span, tag));
            TRY(enter(c, tp));
            TRY(kv_entry(c, ab, aebase, s, s + n, NULL, NULL, NULL));
            LEAVE(c);
            break;
        case TAG(11, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Span, tag));
            TRY(enter(c, tp));
            TRY(event_entry(c, eb, nev++ == 0, s, s + n, tp));
            LEAVE(c);
            break;
        case TAG(13, WT_LEN):
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Span, tag));
            TRY(enter(c, tp));
            TRY(link_entry(c, lb, nln++ == 0, s, s + n, tp));
            LEAVE(c);
            break;
        case TAG(15, WT_LEN): { /* Status; a second occurrence merges into the first */
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Span, tag));
            TRY(enter(c, tp));
            const uint8_t *q = s, *qend = s + n;
            while (q < qend) {
                const uint8_t *tq = q;
                uint32_t stag = 0;
                TRY(rd_tag(c, &q, qend, &stag));
                if (stag == TAG(2, WT_LEN)) {
                    TRY(rd_len(c, &q, qend, &f.msg, &f.msgn, tq, &M_Status, stag));
                    TRY(check_utf8(c, f.msg, f.msgn, tq, &M_Status, 2));
                } else if (stag == TAG(3, WT_VARINT)) {
                    TRY(rd_varint(c, &q, qend, &v, tq));
                    f.code = (int32_t)(uint32_t)v;
                } else {
                    TRY(skip_field(c, &M_Status, stag, &q, qend, tq));
                }
            }
            LEAVE(c);
            break;
        }
        case TAG(16, WT_I32):
            TRY(rd_fixed32(c, &p, end, &f.flags, tp));
            break;
        default:
            TRY(skip_field(c, &M_Span, tag, &p, end, tp));
        }
    }
    TRY(map_finish(c, ab, aebase, 0));
    if (nev) TRY(buf_putc(eb, ']'));
    if (nln) TRY(buf_putc(lb, ']'));
    return emit_span(c, sh, &f, ri, si, pi, nev, nln);
}

/* ScopeSpans: the scope may follow the spans on the wire, so read it (and check everything
 * but the spans) first, then walk the spans. */
static int do_scope_spans(Ctx *c, Shared *sh, size_t ri, size_t si, const uint8_t *p0, const uint8_t *end) {
    const uint8_t *name = EMPTY, *version = EMPTY, *p = p0;
    size_t namen = 0, versionn = 0;
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(1, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ScopeSpans, tag));
            TRY(enter(c, tp));
            const uint8_t *q = s, *qend = s + n;
            while (q < qend) {
                const uint8_t *tq = q;
                uint32_t stag = 0;
                TRY(rd_tag(c, &q, qend, &stag));
                if (stag == TAG(1, WT_LEN)) {
                    TRY(rd_len(c, &q, qend, &name, &namen, tq, &M_Scope, stag));
                    TRY(check_utf8(c, name, namen, tq, &M_Scope, 1));
                } else if (stag == TAG(2, WT_LEN)) {
                    TRY(rd_len(c, &q, qend, &version, &versionn, tq, &M_Scope, stag));
                    TRY(check_utf8(c, version, versionn, tq, &M_Scope, 2));
                } else {
                    TRY(skip_field(c, &M_Scope, stag, &q, qend, tq));
                }
            }
            LEAVE(c);
        } else if (tag == TAG(2, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ScopeSpans, tag)); /* second pass */
        } else {
            TRY(skip_field(c, &M_ScopeSpans, tag, &p, end, tp));
        }
    }
    sh->scope_name = str_or_none(name, namen);
    if (!sh->scope_name) return -1;
    sh->scope_version = str_or_none(version, versionn);
    if (!sh->scope_version) return -1;
    size_t pi = 0;
    for (p = p0; p < end;) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(2, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ScopeSpans, tag));
            TRY(enter(c, tp));
            TRY(do_span(c, sh, ri, si, pi++, s, s + n));
            LEAVE(c);
        } else {
            TRY(skip_unknown(c, tag, &p, end, tp)); /* checked in the first pass */
        }
    }
    return 0;
}

/* ResourceContext.of keeps service.name when the reference's Python value is a str: a string,
 * but also bytes (made base64 text) and a non-finite double (made "nan", "inf", "-inf"). */
static PyObject *service_name(Ctx *c, const AnyState *v) {
    if (v->kind == V_STRING) return str_of(v->s, v->slen);
    if (v->kind == V_BYTES) {
        c->tmp.n = 0;
        if (emit_base64(&c->tmp, v->s, v->slen) < 0) return NULL;
        return PyUnicode_FromStringAndSize(c->tmp.d + 1, (Py_ssize_t)c->tmp.n - 2); /* unquoted */
    }
    if (v->kind == V_DOUBLE) {
        double d;
        memcpy(&d, &v->bits, 8);
        if (isnan(d)) return PyUnicode_FromString("nan");
        if (isinf(d)) return PyUnicode_FromString(d > 0 ? "inf" : "-inf");
    }
    Py_RETURN_NONE;
}

/* ResourceSpans: the resource first (all occurrences, merged), then each ScopeSpans. */
static int do_resource_spans(Ctx *c, Shared *sh, size_t ri, const uint8_t *p0, const uint8_t *end) {
    static const char SERVICE_NAME[] = "service.name";
    Buf *rb = &c->res;
    size_t ebase = c->nents;
    AnyState svc;
    const uint8_t *p = p0;
    svc.kind = V_NONE;
    rb->n = 0;
    TRY(buf_putc(rb, '{'));
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(1, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ResourceSpans, tag));
            TRY(enter(c, tp));
            const uint8_t *q = s, *qend = s + n;
            while (q < qend) { /* Resource */
                const uint8_t *tq = q, *ks = NULL;
                size_t kn = 0;
                uint32_t rtag = 0;
                TRY(rd_tag(c, &q, qend, &rtag));
                if (rtag == TAG(1, WT_LEN)) {
                    const uint8_t *key;
                    size_t klen;
                    AnyState v;
                    TRY(rd_len(c, &q, qend, &ks, &kn, tq, &M_Resource, rtag));
                    TRY(enter(c, tq));
                    TRY(kv_entry(c, rb, ebase, ks, ks + kn, &key, &klen, &v));
                    LEAVE(c);
                    if (klen == sizeof SERVICE_NAME - 1 && !memcmp(key, SERVICE_NAME, klen))
                        svc = v; /* the last one wins, as in a dict */
                } else {
                    TRY(skip_field(c, &M_Resource, rtag, &q, qend, tq));
                }
            }
            LEAVE(c);
        } else if (tag == TAG(2, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ResourceSpans, tag)); /* second pass */
        } else {
            TRY(skip_field(c, &M_ResourceSpans, tag, &p, end, tp));
        }
    }
    TRY(map_finish(c, rb, ebase, 0));
    sh->res_json = str_of((const uint8_t *)rb->d, rb->n);
    if (!sh->res_json) return -1;
    sh->service = service_name(c, &svc);
    if (!sh->service) return -1;
    size_t si = 0;
    for (p = p0; p < end;) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(2, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_ResourceSpans, tag));
            TRY(enter(c, tp));
            int r = do_scope_spans(c, sh, ri, si++, s, s + n);
            Py_CLEAR(sh->scope_name);
            Py_CLEAR(sh->scope_version);
            TRY(r);
            LEAVE(c);
        } else {
            TRY(skip_unknown(c, tag, &p, end, tp)); /* checked in the first pass */
        }
    }
    return 0;
}

static int do_request(Ctx *c, const uint8_t *p, const uint8_t *end) {
    size_t ri = 0;
    while (p < end) {
        const uint8_t *tp = p, *s = NULL;
        size_t n = 0;
        uint32_t tag = 0;
        TRY(rd_tag(c, &p, end, &tag));
        if (tag == TAG(1, WT_LEN)) {
            TRY(rd_len(c, &p, end, &s, &n, tp, &M_Request, tag));
            TRY(enter(c, tp));
            Shared sh = {NULL, NULL, NULL, NULL};
            int r = do_resource_spans(c, &sh, ri++, s, s + n);
            Py_XDECREF(sh.res_json);
            Py_XDECREF(sh.service);
            Py_XDECREF(sh.scope_name);
            Py_XDECREF(sh.scope_version);
            TRY(r);
            LEAVE(c);
        } else {
            TRY(skip_field(c, &M_Request, tag, &p, end, tp));
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Module.
 */

static void ctx_free(Ctx *c) {
    PyMem_Free(c->ents);
    PyMem_Free(c->scratch);
    PyMem_Free(c->tmp.d);
    PyMem_Free(c->attrs.d);
    PyMem_Free(c->events.d);
    PyMem_Free(c->links.d);
    PyMem_Free(c->res.d);
    for (int k = 0; k < NCOLS; k++) {
        if (c->cols[k]) {
            for (size_t i = 0; i < c->nrows; i++) Py_DECREF(c->cols[k][i]);
            PyMem_Free(c->cols[k]);
        }
    }
    Py_XDECREF(c->rejects);
}

PyDoc_STRVAR(decode_traces_doc,
"decode_traces(body, kinds, codes, reject_limit) -> (columns, rejected_count, rejected, bytes_values)\n\n"
"Decode an OTLP ExportTraceServiceRequest. columns is a tuple of lists in COLUMNS order;\n"
"kinds and codes are the tuples of names for SpanKind and StatusCode values (a value outside\n"
"them rejects the span); rejected lists (where, why) for the first reject_limit rejected spans;\n"
"bytes_values is nonzero when some AnyValue was bytes (written as base64 text).\n"
"Raises DecodeError for a body that is not a valid request.");

static PyObject *decode_traces(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *kinds, *codes;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*O!O!n:decode_traces", &view, &PyTuple_Type, &kinds, &PyTuple_Type, &codes, &limit))
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.base = (const uint8_t *)view.buf;
    c.kinds = kinds;
    c.codes = codes;
    c.reject_limit = limit;
    c.rejects = PyList_New(0);
    PyObject *result = NULL;
    if (!c.rejects) goto done;
    if (do_request(&c, c.base, c.base + view.len) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(DecodeError, c.err[0] ? c.err : "malformed body");
        goto done;
    }
    PyObject *cols = PyTuple_New(NCOLS);
    if (!cols) goto done;
    for (int k = 0; k < NCOLS; k++) {
        PyObject *list = PyList_New((Py_ssize_t)c.nrows);
        if (!list) {
            Py_DECREF(cols);
            goto done;
        }
        for (size_t i = 0; i < c.nrows; i++) PyList_SET_ITEM(list, (Py_ssize_t)i, c.cols[k][i]); /* moves */
        PyMem_Free(c.cols[k]);
        c.cols[k] = NULL;
        PyTuple_SET_ITEM(cols, k, list);
    }
    c.nrows = 0;
    result = Py_BuildValue("(NnOn)", cols, c.reject_count, c.rejects, c.bytes_values);
done:
    ctx_free(&c);
    PyBuffer_Release(&view);
    return result;
}

static const char *type_name(uint8_t t) {
    switch (t) {
    case F_VARINT: return "varint";
    case F_FIXED64: return "fixed64";
    case F_FIXED32: return "fixed32";
    case F_STRING: return "string";
    case F_BYTES: return "bytes";
    default: return "message";
    }
}

PyDoc_STRVAR(schema_doc, "_schema() -> {message: {number: (name, kind, submessage)}}: the fields this decoder knows, for tests.");

static PyObject *schema(PyObject *self, PyObject *unused) {
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (size_t i = 0; i < sizeof ALL_MSGS / sizeof ALL_MSGS[0]; i++) {
        const Msg *m = ALL_MSGS[i];
        PyObject *fields = PyDict_New();
        if (!fields || PyDict_SetItemString(out, m->name, fields) < 0) {
            Py_XDECREF(fields);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(fields);
        for (int k = 0; k < m->nfields; k++) {
            const Field *f = &m->fields[k];
            PyObject *key = PyLong_FromUnsignedLong(f->num);
            PyObject *val = Py_BuildValue("(sss)", f->name, type_name(f->type), f->sub ? f->sub->name : "");
            if (!key || !val || PyDict_SetItem(fields, key, val) < 0) {
                Py_XDECREF(key);
                Py_XDECREF(val);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(key);
            Py_DECREF(val);
        }
    }
    return out;
}

/* ------------------------------------------------------------------------------------------
 * Arrow string columns: the store hands DuckDB Arrow tables, and pyarrow's generic converter
 * spends ~100 ns on each Python str. The buffers of a utf8 array are simple enough to fill here.
 */

PyDoc_STRVAR(string_buffers_doc,
"string_buffers(values: list[str | None]) -> (validity: bytes | None, offsets: bytes, data: bytes, nulls: int)\n"
"The buffers of an Arrow utf8 array holding values (int32 offsets in the machine's byte order,\n"
"as Arrow keeps them in memory). OverflowError past 2 GiB of text; TypeError on other types.");

static PyObject *string_buffers(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "string_buffers takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    Py_ssize_t total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(arg, i);
        if (v == Py_None) {
            nulls++;
            continue;
        }
        if (!PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "item %zd is %.100s, not str", i, Py_TYPE(v)->tp_name);
            return NULL;
        }
        Py_ssize_t len;
        if (!PyUnicode_AsUTF8AndSize(v, &len)) return NULL;
        total += len;
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "string column passes 2 GiB");
            return NULL;
        }
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *validity = NULL;
    if (!offsets || !data) goto fail;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (!validity) goto fail;
        memset(PyBytes_AS_STRING(validity), 0, (size_t)(n + 7) / 8);
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    uint8_t *bits = validity ? (uint8_t *)PyBytes_AS_STRING(validity) : NULL;
    int32_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        off[i] = pos;
        PyObject *v = PyList_GET_ITEM(arg, i);
        if (v == Py_None) continue;
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &len);  /* cached by the first pass */
        memcpy(out + pos, utf8, (size_t)len);
        pos += (int32_t)len;
        if (bits) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    off[n] = pos;
    PyObject *result = Py_BuildValue("(OOOn)", validity ? validity : Py_None, offsets, data, nulls);
    Py_XDECREF(validity);
    Py_DECREF(offsets);
    Py_DECREF(data);
    return result;
fail:
    Py_XDECREF(validity);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    return NULL;
}

PyDoc_STRVAR(int64_buffer_doc,
"int64_buffer(values: list[int]) -> bytes\n"
"The data buffer of an Arrow int64 (or timestamp) array holding values, no nulls.\n"
"OverflowError for a value outside int64; TypeError on other types.");

static PyObject *int64_buffer(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "int64_buffer takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!data) return NULL;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(arg, i);
        if (!PyLong_Check(v)) {
            Py_DECREF(data);
            PyErr_Format(PyExc_TypeError, "item %zd is %.100s, not int", i, Py_TYPE(v)->tp_name);
            return NULL;
        }
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(data);
            return NULL;
        }
        out[i] = (int64_t)x;
    }
    return data;
}

/* collector/_summaries.c: per-trace summaries of GenAI-semconv spans, in the same extension. */
PyObject *genai_summaries(PyObject *self, PyObject *args);
extern const char *const genai_summaries_doc_text;
int add_trace_states(PyObject *module);
/* collector/_keywindow.c: the store's window of recent keys. */
int add_key_window(PyObject *module);
/* collector/_evidence.c: evidence in a tool result's text. */
PyObject *evidence_spec(PyObject *self, PyObject *args);
PyObject *evidence_scan_py(PyObject *self, PyObject *args);
PyObject *json_canonical_py(PyObject *self, PyObject *arg);
PyObject *json_text_py(PyObject *self, PyObject *arg);
extern const char *const evidence_spec_doc_text, *const evidence_scan_doc_text, *const json_canonical_doc_text,
    *const json_text_doc_text;

static PyMethodDef methods[] = {
    {"genai_summaries", genai_summaries, METH_VARARGS, NULL},
    {"evidence_spec", evidence_spec, METH_VARARGS, NULL},
    {"evidence_scan", evidence_scan_py, METH_VARARGS, NULL},
    {"json_canonical", json_canonical_py, METH_O, NULL},
    {"json_text", json_text_py, METH_O, NULL},
    {"decode_traces", decode_traces, METH_VARARGS, decode_traces_doc},
    {"string_buffers", string_buffers, METH_O, string_buffers_doc},
    {"int64_buffer", int64_buffer, METH_O, int64_buffer_doc},
    {"_schema", schema, METH_NOARGS, schema_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire",
    "Compiled decoder for OTLP ExportTraceServiceRequest protobuf bodies into SpanBatch columns.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__wire(void) {
    for (int i = 0; i < 256; i++) JSON_CLASS[i] = i < 0x20 ? 1 : (i >= 0x80 ? 2 : 0);
    JSON_CLASS['"'] = JSON_CLASS['\\'] = 1;
    methods[0].ml_doc = genai_summaries_doc_text;
    methods[1].ml_doc = evidence_spec_doc_text;
    methods[2].ml_doc = evidence_scan_doc_text;
    methods[3].ml_doc = json_canonical_doc_text;
    methods[4].ml_doc = json_text_doc_text;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    DecodeError = PyErr_NewExceptionWithDoc("agentfunnel.collector._wire.DecodeError",
                                            "The body is not a valid ExportTraceServiceRequest.",
                                            PyExc_ValueError, NULL);
    if (!DecodeError || PyModule_AddObjectRef(m, "DecodeError", DecodeError) < 0) goto error;
    PyObject *names = PyTuple_New(NCOLS);
    if (!names) goto error;
    for (int k = 0; k < NCOLS; k++) {
        PyObject *s = PyUnicode_FromString(COLUMN_NAMES[k]);
        if (!s) {
            Py_DECREF(names);
            goto error;
        }
        PyTuple_SET_ITEM(names, k, s);
    }
    if (PyModule_AddObject(m, "COLUMNS", names) < 0) {
        Py_DECREF(names);
        goto error;
    }
    if (PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0) goto error;
    if (add_trace_states(m) < 0) goto error;
    if (add_key_window(m) < 0) goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
