/* Evidence in a tool result's text, read without making Python objects of it.
 *
 * The reference is scoring.evidence.find over semconv's parse_json of the text, and
 * scoring.dropoff.payment_mentions over the same parsed value (its phrases looked for in str() of
 * it, lowered). This reader parses the JSON into a flat tree of its own, runs the same two walks
 * with the same limits, and looks for the phrases in the same text str() would give (a dict's or a
 * list's repr, a string itself, the raw text when it is not JSON), lowered as str.lower lowers it
 * for ASCII phrases. Whatever it cannot read exactly (text that is not well-formed JSON but starts
 * like it, invalid UTF-8, lone surrogates, a key given twice, nesting past MAX_NEST, a long number or text,
 * a status with non-ASCII letters) it declines, and the caller reads the result the reference's
 * way: declining is never a different answer, only a slower one.
 *
 * Compiled into the _wire extension (see pyproject.toml); _wire.c lists its functions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_NEST 64      /* deeper JSON is declined (the reference parses up to the recursion limit) */
#define WALK_DEPTH 8     /* scoring.evidence.MAX_DEPTH */
#define WALK_ITEMS 200   /* scoring.evidence.MAX_ITEMS */
#define OPTIONS_DEPTH 6  /* scoring.evidence.OPTIONS_DEPTH */
#define MAX_KEYS 64      /* an object with more members is declined (its keys are checked pairwise) */
#define MAX_NUMBER 64    /* a longer number is declined (int() and float() of it are not redone here) */
#define MAX_TEXT (1 << 20) /* a longer text is declined: a tree costs about 50 bytes a value, so this bounds it */

enum { J_NULL, J_FALSE, J_TRUE, J_INT, J_FLOAT, J_NAN, J_INF, J_NINF, J_STR, J_ARR, J_OBJ };

typedef struct {
    uint8_t type;
    uint8_t truthy;
    uint8_t own_repr; /* a float whose text is its repr (``float_is_own_repr``), read once */
    int32_t next;          /* the next member of the same container, -1 at its end */
    int32_t first;         /* a container's first member, -1 when empty */
    uint32_t count;        /* a container's members */
    Py_ssize_t off, len;   /* a string: its decoded bytes in the tree's buffer; a number: its text */
    Py_ssize_t koff, klen; /* an object member: its key's decoded bytes */
} Node;

typedef struct {
    Node *nodes;
    int32_t n, cap;
    uint8_t *buf; /* decoded strings */
    Py_ssize_t blen, bcap;
    const uint8_t *src;
} Tree;

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Bytes;

/* One flag's keys, or a list of words; each an UTF-8 string. */
typedef struct {
    Bytes *items;
    uint32_t *masks; /* per key, the flags its presence raises (by_presence only) */
    uint8_t *confirmation; /* per booking key: "confirmation" in key.lower() */
    Py_ssize_t n;
} List;

typedef struct {
    List presence, order_ids, bookings, order_objects, confirmed, checkout_statuses, ok_phrases, failed_phrases;
    uint32_t order_confirmed, order_pending, checkout_status, checkout_page, options_without_ids;
} Spec;

#define SPEC_CAPSULE "agentfunnel.evidence_spec"

/* ---- the tree -------------------------------------------------------------------------------- */

static int32_t node_new(Tree *t, uint8_t type) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 64;
        Node *nodes = PyMem_Realloc(t->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) return -1;
        t->nodes = nodes, t->cap = cap;
    }
    Node *x = &t->nodes[t->n];
    memset(x, 0, sizeof *x);
    x->type = type, x->next = x->first = -1;
    return t->n++;
}

static int buf_put(Tree *t, const uint8_t *p, Py_ssize_t n) {
    if (t->blen + n > t->bcap) {
        Py_ssize_t cap = t->bcap ? t->bcap : 256;
        while (cap < t->blen + n) cap *= 2;
        uint8_t *b = PyMem_Realloc(t->buf, (size_t)cap);
        if (!b) return -1;
        t->buf = b, t->bcap = cap;
    }
    memcpy(t->buf + t->blen, p, (size_t)n);
    t->blen += n;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (1-4), its code point in *cp; 0 if invalid (overlong,
 * surrogate, past U+10FFFF, cut). */
static int utf8_at(const uint8_t *p, const uint8_t *end, uint32_t *cp) {
    uint8_t c = p[0];
    if (c < 0x80) return *cp = c, 1;
    int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (!n || c > 0xF4 || end - p < n) return 0;
    uint32_t v = c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

static int utf8_put(uint8_t *out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(const uint8_t *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* A JSON string from the quote at *pp: decoded into the buffer. 1 read, 0 declined, -1 no memory. */
static int string_at(Tree *t, const uint8_t **pp, const uint8_t *end, Py_ssize_t *off, Py_ssize_t *len) {
    const uint8_t *p = *pp + 1;
    *off = t->blen;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
        if (p > run && buf_put(t, run, p - run) < 0) return -1;
        if (p >= end) return 0;
        uint8_t c = *p;
        if (c == '"') {
            *len = t->blen - *off;
            *pp = p + 1;
            return 1;
        }
        if (c < 0x20) return 0; /* strict: a control character */
        if (c >= 0x80) {
            uint32_t cp;
            int n = utf8_at(p, end, &cp);
            if (!n) return 0;
            if (buf_put(t, p, n) < 0) return -1;
            p += n;
            continue;
        }
        if (end - p < 2) return 0;
        uint8_t e = p[1], one;
        p += 2;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (end - p < 4 || hex4(p, &cp) < 0) return 0;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return 0; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                    return 0; /* a lone high surrogate */
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            uint8_t enc[4];
            if (buf_put(t, enc, utf8_put(enc, cp)) < 0) return -1;
            continue;
        }
        default: return 0;
        }
        if (buf_put(t, &one, 1) < 0) return -1;
    }
    return 0;
}

/* Whether float(text) reads back as the text itself through repr (so neither needs redoing): a JSON float with no
 * exponent, at most 15 significant digits (distinct such decimals are distinct doubles, so repr's shortest digits are
 * these), no zero ending its fraction unless the fraction is that zero, and in repr's fixed notation
 * (1e-4 <= |x| < 1e16, or zero). Others (``1.50``, ``1e3``, ``0.00001``) take float() and repr. */
static int float_is_own_repr(const char *s, Py_ssize_t n) {
    Py_ssize_t i = s[0] == '-';
    Py_ssize_t int_at = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    Py_ssize_t int_len = i - int_at;
    if (!int_len || i >= n || s[i] != '.') return 0;
    Py_ssize_t frac_at = ++i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    Py_ssize_t frac_len = i - frac_at;
    if (i != n || !frac_len) return 0;
    int int_zero = int_len == 1 && s[int_at] == '0';
    if (frac_len == 1 && s[frac_at] == '0') return int_len <= 15;
    if (s[n - 1] == '0') return 0;
    if (!int_zero) return int_len + frac_len <= 15;
    Py_ssize_t zeros = 0;
    while (s[frac_at + zeros] == '0') zeros++;
    return zeros <= 3 && frac_len - zeros <= 15;
}

/* A number from *pp, as json's scanner matches it; 1 read, 0 declined. */
static int number_at(Tree *t, const uint8_t **pp, const uint8_t *end, int32_t x) {
    const uint8_t *p = *pp, *s = p;
    int is_float = 0, exponent = 0, nonzero = 0;
    if (p < end && *p == '-') p++;
    if (p < end && *p == '0') p++;
    else if (p < end && *p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') nonzero = 1, p++;
    } else
        return 0;
    if (p + 1 < end && *p == '.' && p[1] >= '0' && p[1] <= '9') {
        is_float = 1, p++;
        while (p < end && *p >= '0' && *p <= '9') nonzero |= *p != '0', p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        const uint8_t *q = p + 1;
        if (q < end && (*q == '-' || *q == '+')) q++;
        if (q < end && *q >= '0' && *q <= '9') {
            while (q < end && *q >= '0' && *q <= '9') q++;
            is_float = 1, exponent = 1, p = q;
        }
    }
    if (p - s > MAX_NUMBER) return 0;
    Node *n = &t->nodes[x];
    n->type = is_float ? J_FLOAT : J_INT, n->off = s - t->src, n->len = p - s;
    n->own_repr = (uint8_t)(is_float && !exponent && float_is_own_repr((const char *)s, p - s));
    if (is_float && !exponent) /* no exponent: nothing underflows to zero within MAX_NUMBER digits */
        n->truthy = (uint8_t)nonzero;
    else if (is_float) {
        char tmp[MAX_NUMBER + 1];
        memcpy(tmp, s, (size_t)(p - s));
        tmp[p - s] = 0;
        double d = PyOS_string_to_double(tmp, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        n->truthy = d != 0.0;
    } else
        n->truthy = (uint8_t)nonzero;
    *pp = p;
    return 1;
}

static int word_at(const uint8_t **pp, const uint8_t *end, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(end - *pp) < n || memcmp(*pp, w, n)) return 0;
    *pp += n;
    return 1;
}

static const uint8_t *skip_ws(const uint8_t *p, const uint8_t *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static int same_key(const Tree *t, const Node *a, const Node *b) {
    return a->klen == b->klen && !memcmp(t->buf + a->koff, t->buf + b->koff, (size_t)a->klen);
}

/* The containers being read, innermost last. */
typedef struct {
    int32_t node, last;
} Open;

/* Parse [p, end) as exactly one JSON value into the tree (its root is node 0). 1 read, 0 declined, -1 error. */
static int parse(Tree *t, const uint8_t *p, const uint8_t *end) {
    Open open[MAX_NEST];
    int depth = 0;
    for (;;) {
        /* a value at p: a member of open[depth-1], or the root */
        Py_ssize_t koff = 0, klen = 0;
        if (depth && t->nodes[open[depth - 1].node].type == J_OBJ) {
            if (p >= end || *p != '"') return 0;
            int r = string_at(t, &p, end, &koff, &klen);
            if (r <= 0) return r;
            p = skip_ws(p, end);
            if (p >= end || *p != ':') return 0;
            p = skip_ws(p + 1, end);
        }
        if (p >= end) return 0;
        uint8_t c = *p;
        int32_t x = node_new(t, J_NULL);
        if (x < 0) return -1;
        Node *v = &t->nodes[x];
        v->koff = koff, v->klen = klen;
        if (depth) {
            Open *o = &open[depth - 1];
            Node *parent = &t->nodes[o->node];
            if (o->last < 0) parent->first = x;
            else t->nodes[o->last].next = x;
            o->last = x;
            if (++parent->count > MAX_KEYS && parent->type == J_OBJ) return 0;
        }
        int opened = 0;
        if (c == '{' || c == '[') {
            if (depth == MAX_NEST) return 0;
            v->type = c == '{' ? J_OBJ : J_ARR;
            open[depth].node = x, open[depth].last = -1;
            depth++;
            opened = 1;
            p = skip_ws(p + 1, end);
            if (p < end && *p == (c == '{' ? '}' : ']')) {
                depth--, p++;
                opened = 0;
            }
        } else if (c == '"') {
            Py_ssize_t off, len;
            int r = string_at(t, &p, end, &off, &len);
            if (r <= 0) return r;
            v = &t->nodes[x];
            v->type = J_STR, v->off = off, v->len = len, v->truthy = len > 0;
        } else if (word_at(&p, end, "null")) v->type = J_NULL;
        else if (word_at(&p, end, "true")) v->type = J_TRUE, v->truthy = 1;
        else if (word_at(&p, end, "false")) v->type = J_FALSE;
        else if (word_at(&p, end, "NaN")) v->type = J_NAN, v->truthy = 1;
        else if (word_at(&p, end, "Infinity")) v->type = J_INF, v->truthy = 1;
        else if (word_at(&p, end, "-Infinity")) v->type = J_NINF, v->truthy = 1;
        else if (number_at(t, &p, end, x) <= 0) return 0;
        if (opened) continue;
        /* close every container this value ends */
        for (;;) {
            if (!depth) return skip_ws(p, end) == end ? 1 : 0; /* the caller strips: nothing may follow */
            Open *o = &open[depth - 1];
            Node *parent = &t->nodes[o->node];
            parent->truthy = parent->count > 0;
            p = skip_ws(p, end);
            if (p >= end) return 0;
            if (*p == ',') {
                p = skip_ws(p + 1, end);
                break;
            }
            if (*p != (parent->type == J_OBJ ? '}' : ']')) return 0;
            p++;
            if (parent->type == J_OBJ) /* a key given twice: the reference keeps the first place, the last value */
                for (int32_t a = parent->first; a >= 0; a = t->nodes[a].next)
                    for (int32_t b = t->nodes[a].next; b >= 0; b = t->nodes[b].next)
                        if (same_key(t, &t->nodes[a], &t->nodes[b])) return 0;
            depth--;
        }
    }
}

/* ---- the walks (scoring.evidence) ------------------------------------------------------------- */

static int key_is(const Tree *t, const Node *m, const char *k) {
    size_t n = strlen(k);
    return (size_t)m->klen == n && !memcmp(t->buf + m->koff, k, n);
}

static int key_in(const Tree *t, const Node *m, const List *l) {
    for (Py_ssize_t i = 0; i < l->n; i++)
        if (m->klen == l->items[i].n && !memcmp(t->buf + m->koff, l->items[i].p, (size_t)m->klen)) return (int)i;
    return -1;
}

static const Node *member(const Tree *t, const Node *obj, const uint8_t *k, Py_ssize_t n) {
    for (int32_t i = obj->first; i >= 0; i = t->nodes[i].next) {
        const Node *m = &t->nodes[i];
        if (m->klen == n && !memcmp(t->buf + m->koff, k, (size_t)n)) return m;
    }
    return NULL;
}

static const Node *get(const Tree *t, const Node *obj, const char *k) {
    return member(t, obj, (const uint8_t *)k, (Py_ssize_t)strlen(k));
}

static int present(const Node *v) { /* not in (None, "", [], {}) */
    if (!v || v->type == J_NULL) return 0;
    if (v->type == J_STR) return v->len > 0;
    if (v->type == J_ARR || v->type == J_OBJ) return v->count > 0;
    return 1;
}

/* ``a or b``, a missing value being None (falsy) */
static const Node *either(const Node *a, const Node *b) { return a && a->truthy ? a : b; }

/* _status: 1 with the lowered status in *s (a string), 0 none, -1 declined (not ASCII, or long). */
static int status_of(const Tree *t, const Node *d, uint8_t *s, Py_ssize_t cap, Py_ssize_t *n) {
    const Node *v = either(get(t, d, "status"), get(t, d, "state"));
    if (!v || v->type != J_STR) return 0;
    if (v->len > cap) return -1;
    for (Py_ssize_t i = 0; i < v->len; i++) {
        uint8_t c = t->buf[v->off + i];
        if (c >= 0x80) return -1;
        s[i] = c >= 'A' && c <= 'Z' ? (uint8_t)(c + 32) : c;
    }
    *n = v->len;
    return 1;
}

static int listed(const List *l, const uint8_t *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < l->n; i++)
        if (l->items[i].n == n && !memcmp(l->items[i].p, s, (size_t)n)) return 1;
    return 0;
}

static int contains(const uint8_t *h, Py_ssize_t hn, const char *needle) {
    Py_ssize_t n = (Py_ssize_t)strlen(needle);
    for (Py_ssize_t i = 0; i + n <= hn; i++)
        if (!memcmp(h + i, needle, (size_t)n)) return 1;
    return 0;
}

#define STATUS_CAP 128

/* find's flags of the tree; 1 read, 0 declined, -1 no memory. */
static int find(const Tree *t, const Spec *sp, uint32_t *mask) {
    typedef struct {
        int32_t node, depth;
    } Item;
    static const char *const OPTION_KEYS[] = {"variants", "options", "sizes", "colors", "colours"};
    uint32_t found = 0;
    int option_keys = 0, checkout_page = 0;
    Item *stack = PyMem_Malloc((size_t)(t->n + 1) * sizeof *stack);
    if (!stack) return -1;
    int32_t top = 0;
    stack[top++] = (Item){0, 0};
    while (top) {
        Item it = stack[--top];
        const Node *v = &t->nodes[it.node];
        if (v->type != J_OBJ && v->type != J_ARR) continue;
        int in_dict = v->type == J_OBJ, deeper = it.depth < WALK_DEPTH;
        uint32_t seen = 0;
        for (int32_t i = v->first; i >= 0 && (in_dict || seen < WALK_ITEMS); i = t->nodes[i].next, seen++) {
            const Node *m = &t->nodes[i];
            if (m->type == J_STR) {
                if (in_dict && !checkout_page && m->len >= 4 && !memcmp(t->buf + m->off, "http", 4) &&
                    contains(t->buf + m->off, m->len, "/checkout"))
                    checkout_page = 1;
            } else if (deeper && (m->type == J_OBJ || m->type == J_ARR))
                stack[top++] = (Item){i, it.depth + 1};
        }
        if (!in_dict) continue;
        /* a dict of the walk: what its keys prove */
        int with_status = 0, order_id = 0;
        for (int32_t i = v->first; i >= 0; i = t->nodes[i].next) {
            const Node *m = &t->nodes[i];
            for (size_t k = 0; !option_keys && k < sizeof OPTION_KEYS / sizeof *OPTION_KEYS; k++)
                option_keys = key_is(t, m, OPTION_KEYS[k]);
            if (!present(m)) continue;
            int at = key_in(t, m, &sp->presence);
            if (at >= 0) found |= sp->presence.masks[at];
            int is_order_id = key_in(t, m, &sp->order_ids) >= 0;
            order_id |= is_order_id;
            with_status |= is_order_id || key_in(t, m, &sp->bookings) >= 0 || key_in(t, m, &sp->order_objects) >= 0 ||
                           key_is(t, m, "status") || key_is(t, m, "state");
        }
        if (!with_status) continue;
        uint8_t st[STATUS_CAP];
        Py_ssize_t sn = 0;
        for (Py_ssize_t k = 0; k < sp->order_objects.n; k++) {
            const Node *obj = member(t, v, sp->order_objects.items[k].p, sp->order_objects.items[k].n);
            if (!obj || obj->type != J_OBJ) continue;
            const Node *number = get(t, obj, "confirmation_number");
            if (!present(either(get(t, obj, "id"), number))) continue;
            int has = status_of(t, obj, st, STATUS_CAP, &sn);
            if (has < 0) goto declined;
            found |= (has && listed(&sp->confirmed, st, sn)) || (!has && present(number)) ? sp->order_confirmed
                                                                                          : sp->order_pending;
        }
        int has = status_of(t, v, st, STATUS_CAP, &sn);
        if (has < 0) goto declined;
        int confirmed = has && listed(&sp->confirmed, st, sn);
        if (order_id) found |= confirmed ? sp->order_confirmed : sp->order_pending;
        for (Py_ssize_t k = 0; k < sp->bookings.n; k++)
            if (present(member(t, v, sp->bookings.items[k].p, sp->bookings.items[k].n)) &&
                (confirmed || (!has && sp->bookings.confirmation[k])))
                found |= sp->order_confirmed;
        if (has && listed(&sp->checkout_statuses, st, sn)) found |= sp->checkout_status;
    }
    if (checkout_page) found |= sp->checkout_page;
    if (option_keys) { /* _options_without_ids */
        top = 0;
        stack[top++] = (Item){0, 0};
        while (top) {
            Item it = stack[--top];
            const Node *v = &t->nodes[it.node];
            if (it.depth > OPTIONS_DEPTH) continue;
            if (v->type == J_OBJ) {
                const Node *variants = get(t, v, "variants");
                if (variants && variants->type == J_ARR && variants->count) {
                    int mapped = 0;
                    for (int32_t i = variants->first; i >= 0 && !mapped; i = t->nodes[i].next) {
                        const Node *x = &t->nodes[i];
                        mapped = x->type == J_OBJ && present(either(get(t, x, "id"), get(t, x, "variant_id")));
                    }
                    if (!mapped) {
                        found |= sp->options_without_ids;
                        break;
                    }
                    continue;
                }
                const Node *o = get(t, v, "options"), *s = get(t, v, "sizes"), *c = get(t, v, "colors"),
                           *u = get(t, v, "colours");
                if (((o && o->truthy) || (s && s->truthy) || (c && c->truthy) || (u && u->truthy)) &&
                    !present(get(t, v, "variant_id"))) {
                    found |= sp->options_without_ids;
                    break;
                }
            } else if (v->type != J_ARR)
                continue;
            uint32_t seen = 0;
            for (int32_t i = v->first; i >= 0 && (v->type == J_OBJ || seen < WALK_ITEMS); i = t->nodes[i].next, seen++) {
                const Node *m = &t->nodes[i];
                if ((m->type == J_OBJ || m->type == J_ARR) && !(v->type == J_OBJ && key_is(t, m, "variants")))
                    stack[top++] = (Item){i, it.depth + 1};
            }
        }
    }
    PyMem_Free(stack);
    *mask = found;
    return 1;
declined:
    PyMem_Free(stack);
    return 0;
}

/* ---- str(value).lower(), for ASCII phrases ---------------------------------------------------- */

/* Lowered text: ASCII as str.lower gives it; a code point outside ASCII is one byte 0x80 (no ASCII
 * phrase matches it), except the two whose lower case has an ASCII letter: U+0130 and U+212A. */
typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} Out;

static int out_room(Out *o, Py_ssize_t n) {
    if (o->n + n > o->cap) {
        Py_ssize_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n) cap *= 2;
        uint8_t *p = PyMem_Realloc(o->p, (size_t)cap);
        if (!p) return -1;
        o->p = p, o->cap = cap;
    }
    return 0;
}

/* The bytes as they are. */
static int out_raw(Out *o, const char *s, Py_ssize_t n) {
    if (out_room(o, n) < 0) return -1;
    memcpy(o->p + o->n, s, (size_t)n);
    o->n += n;
    return 0;
}

/* The bytes lowered (ASCII letters). */
static int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_room(o, n) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        o->p[o->n++] = c >= 'A' && c <= 'Z' ? (uint8_t)(c + 32) : c;
    }
    return 0;
}

static int lower_cp(Out *o, uint32_t cp) {
    if (cp == 0x130) return out_put(o, "i\x80", 2);
    if (cp == 0x212A) return out_put(o, "k", 1);
    return out_put(o, "\x80", 1);
}

/* Lowered UTF-8 text (already valid), as it is. */
static int lower_text(Out *o, const uint8_t *p, Py_ssize_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p < 0x80) p++;
        if (p > run && out_put(o, (const char *)run, p - run) < 0) return -1;
        if (p >= end) break;
        uint32_t cp;
        int k = utf8_at(p, end, &cp);
        if (!k || lower_cp(o, cp) < 0) return -1;
        p += k;
    }
    return 0;
}

/* A string's repr, lowered. */
static int repr_str(Out *o, const uint8_t *p, Py_ssize_t n) {
    int single = memchr(p, '\'', (size_t)n) != NULL, dbl = memchr(p, '"', (size_t)n) != NULL;
    char q = single && !dbl ? '"' : '\'';
    if (out_put(o, &q, 1) < 0) return -1;
    const uint8_t *end = p + n;
    char esc[16];
    while (p < end) {
        uint8_t c = *p;
        int r;
        if (c < 0x80) {
            p++;
            if (c == (uint8_t)q || c == '\\') esc[0] = '\\', esc[1] = (char)c, r = out_put(o, esc, 2);
            else if (c == '\t') r = out_put(o, "\\t", 2);
            else if (c == '\n') r = out_put(o, "\\n", 2);
            else if (c == '\r') r = out_put(o, "\\r", 2);
            else if (c < 0x20 || c == 0x7F) snprintf(esc, sizeof esc, "\\x%02x", c), r = out_put(o, esc, 4);
            else esc[0] = (char)c, r = out_put(o, esc, 1);
        } else {
            uint32_t cp;
            int k = utf8_at(p, end, &cp);
            if (!k) return -1;
            p += k;
            if (Py_UNICODE_ISPRINTABLE(cp)) r = lower_cp(o, cp);
            else if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", cp), r = out_put(o, esc, 4);
            else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", cp), r = out_put(o, esc, 6);
            else snprintf(esc, sizeof esc, "\\U%08x", cp), r = out_put(o, esc, 10);
        }
        if (r < 0) return -1;
    }
    return out_put(o, &q, 1);
}

static int repr_number(Out *o, const Tree *t, const Node *v) {
    const char *s = (const char *)t->src + v->off;
    if (v->type == J_INT) {
        if (v->len == 2 && s[0] == '-' && s[1] == '0') return out_put(o, "0", 1);
        return out_put(o, s, v->len);
    }
    if (v->own_repr) return out_put(o, s, v->len);
    char tmp[MAX_NUMBER + 1];
    memcpy(tmp, s, (size_t)v->len);
    tmp[v->len] = 0;
    double d = PyOS_string_to_double(tmp, NULL, NULL);
    char *r = d == -1.0 && PyErr_Occurred() ? NULL : PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!r) return -1;
    int ok = out_put(o, r, (Py_ssize_t)strlen(r));
    PyMem_Free(r);
    return ok;
}

/* repr of the value at x (dict, list or scalar inside them), lowered; no recursion: a stack of the
 * containers being written, each with the member to write next. */
static int repr_tree(Out *o, const Tree *t, int32_t x) {
    int32_t stack[MAX_NEST + 1], at[MAX_NEST + 1];
    int depth = 0;
    for (;;) {
        const Node *v = &t->nodes[x];
        int r = 0;
        switch (v->type) {
        case J_NULL: r = out_put(o, "None", 4); break;
        case J_TRUE: r = out_put(o, "True", 4); break;
        case J_FALSE: r = out_put(o, "False", 5); break;
        case J_NAN: r = out_put(o, "nan", 3); break;
        case J_INF: r = out_put(o, "inf", 3); break;
        case J_NINF: r = out_put(o, "-inf", 4); break;
        case J_INT:
        case J_FLOAT: r = repr_number(o, t, v); break;
        case J_STR: r = repr_str(o, t->buf + v->off, v->len); break;
        default:
            r = out_put(o, v->type == J_OBJ ? "{" : "[", 1);
            if (r < 0) return -1;
            stack[depth] = x, at[depth] = v->first, depth++;
            goto next;
        }
        if (r < 0) return -1;
        if (!depth) return 0;
        at[depth - 1] = t->nodes[x].next;
        if (at[depth - 1] >= 0 && out_put(o, ", ", 2) < 0) return -1;
    next:
        while (depth && at[depth - 1] < 0) { /* close the containers written whole */
            if (out_put(o, t->nodes[stack[depth - 1]].type == J_OBJ ? "}" : "]", 1) < 0) return -1;
            if (--depth == 0) return 0;
            at[depth - 1] = t->nodes[stack[depth]].next;
            if (at[depth - 1] >= 0 && out_put(o, ", ", 2) < 0) return -1;
        }
        x = at[depth - 1];
        if (t->nodes[stack[depth - 1]].type == J_OBJ) {
            const Node *m = &t->nodes[x];
            if (repr_str(o, t->buf + m->koff, m->klen) < 0 || out_put(o, ": ", 2) < 0) return -1;
        }
    }
}

static int has_phrase(const Out *o, const List *phrases) {
    for (Py_ssize_t i = 0; i < phrases->n; i++) {
        Py_ssize_t n = phrases->items[i].n;
        if (n == 0) return 1;
        if (n > o->n) continue;
        const uint8_t *first = phrases->items[i].p, *at = o->p, *last = o->p + (o->n - n); /* a match's last start */
        while (at <= last && (at = memchr(at, first[0], (size_t)(last - at + 1))) != NULL) {
            if (!memcmp(at, first, (size_t)n)) return 1;
            at++;
        }
    }
    return 0;
}

/* ---- the reading ----------------------------------------------------------------------------- */

static int is_space(uint32_t cp) {
    return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x1F) || (cp >= 0x80 && Py_UNICODE_ISSPACE(cp));
}

/* The end of a reading: its buffers freed, and an error (r < 0) raised if nothing has raised it yet. */
static int finish(int r, Out *o, Tree *t) {
    if (r < 0 && !PyErr_Occurred()) PyErr_NoMemory();
    PyMem_Free(o->p);
    PyMem_Free(t->nodes);
    PyMem_Free(t->buf);
    return r;
}

/* semconv's parse_json on valid UTF-8 text: [*s, *e) is the text stripped; 1 when parse_json would parse it
 * as JSON, 0 when it stays the text it is, -1 when the text is declined (not UTF-8, or longer than MAX_TEXT). */
static int parse_json_span(const uint8_t *text, Py_ssize_t n, const uint8_t **sp, const uint8_t **ep) {
    const uint8_t *end = text + n, *s = text, *e = end;
    if (n > MAX_TEXT) return -1;
    for (const uint8_t *p = text; p < end;) { /* the whole text is valid UTF-8, or declined */
        uint64_t w;
        if (end - p >= 8 && (memcpy(&w, p, 8), !(w & 0x8080808080808080ULL))) { /* eight ASCII bytes at once */
            p += 8;
            continue;
        }
        uint32_t cp;
        int k = utf8_at(p, end, &cp);
        if (!k) return -1;
        p += k;
    }
    while (s < e) { /* str.strip() */
        uint32_t cp;
        int k = utf8_at(s, e, &cp);
        if (!is_space(cp)) break;
        s += k;
    }
    while (e > s) {
        const uint8_t *q = e - 1;
        while (q > s && (*q & 0xC0) == 0x80) q--;
        uint32_t cp;
        utf8_at(q, e, &cp);
        if (!is_space(cp)) break;
        e = q;
    }
    *sp = s, *ep = e;
    Py_ssize_t sn = e - s;
    return sn && (*s == '{' || *s == '[' || *s == '"' || (sn == 4 && !memcmp(s, "true", 4)) ||
                  (sn == 5 && !memcmp(s, "false", 5)) || (sn == 4 && !memcmp(s, "null", 4)));
}

/* The text's flags (its result read by find, when ``failed`` is 0) and whether it mentions payment as
 * payment_mentions reads a result (the failed call's error aside). 1 read, 0 declined, -1 error. */
int evidence_scan(PyObject *capsule, const uint8_t *text, Py_ssize_t n, int failed, uint32_t *mask, int *payment) {
    const Spec *sp = PyCapsule_GetPointer(capsule, SPEC_CAPSULE);
    if (!sp) return -1;
    const uint8_t *s, *e;
    int json = parse_json_span(text, n, &s, &e);
    if (json < 0) return 0;
    const List *phrases = failed ? &sp->failed_phrases : &sp->ok_phrases;
    Out o = {NULL, 0, 0};
    int r = 1;
    *mask = 0, *payment = 0;
    if (!json) { /* the text itself: no evidence, its words as they are */
        if (phrases->n) {
            if (lower_text(&o, text, n) < 0) r = -1;
            else *payment = has_phrase(&o, phrases);
        }
        if (r < 0) PyErr_NoMemory();
        PyMem_Free(o.p);
        return r;
    }
    Tree t = {NULL, 0, 0, NULL, 0, 0, text};
    r = parse(&t, s, e);
    if (r == 1) {
        const Node *root = &t.nodes[0];
        if (!failed && (root->type == J_OBJ || root->type == J_ARR)) r = find(&t, sp, mask);
        if (r == 1 && phrases->n && root->type != J_NULL) {
            int w = root->type == J_STR ? lower_text(&o, t.buf + root->off, root->len) : repr_tree(&o, &t, 0);
            if (w < 0) r = -1;
            else *payment = has_phrase(&o, phrases);
        }
    }
    return finish(r, &o, &t);
}

/* ---- json.dumps of the parsed value ------------------------------------------------------------- */

/* A string as json.dumps writes it: ``ascii`` escapes everything outside ' '..'~' (ensure_ascii). */
static int dump_str(Out *o, const uint8_t *p, Py_ssize_t n, int ascii) {
    static const char H[] = "0123456789abcdef";
    const uint8_t *end = p + n;
    if (out_raw(o, "\"", 1) < 0) return -1;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\' && (!ascii || *p < 0x7F)) p++;
        if (p > run && out_raw(o, (const char *)run, p - run) < 0) return -1;
        if (p >= end) break;
        uint8_t c = *p;
        const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (named) {
            if (out_raw(o, named, 2) < 0) return -1;
            p++;
            continue;
        }
        uint32_t cp;
        int k = c < 0x80 ? (cp = c, 1) : utf8_at(p, end, &cp);
        if (!k) return -1;
        p += k;
        uint32_t units[2] = {cp, 0};
        int nu = 1;
        if (cp >= 0x10000) units[0] = 0xD800 + ((cp - 0x10000) >> 10), units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF), nu = 2;
        for (int u = 0; u < nu; u++) {
            char esc[6] = {'\\', 'u', H[units[u] >> 12 & 15], H[units[u] >> 8 & 15], H[units[u] >> 4 & 15], H[units[u] & 15]};
            if (out_raw(o, esc, 6) < 0) return -1;
        }
    }
    return out_raw(o, "\"", 1);
}

static int key_before(const Tree *t, int32_t a, int32_t b) {
    const Node *x = &t->nodes[a], *y = &t->nodes[b];
    Py_ssize_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(t->buf + x->koff, t->buf + y->koff, (size_t)n);
    return c < 0 || (c == 0 && x->klen < y->klen);
}

/* json.dumps(value, sort_keys=sort, ensure_ascii=ascii) of the value at x (nesting is at most MAX_NEST). */
static int dump_value(Out *o, const Tree *t, int32_t x, int sort, int ascii) {
    const Node *v = &t->nodes[x];
    const char *s = (const char *)t->src + v->off;
    switch (v->type) {
    case J_NULL: return out_raw(o, "null", 4);
    case J_TRUE: return out_raw(o, "true", 4);
    case J_FALSE: return out_raw(o, "false", 5);
    case J_NAN: return out_raw(o, "NaN", 3);
    case J_INF: return out_raw(o, "Infinity", 8);
    case J_NINF: return out_raw(o, "-Infinity", 9);
    case J_INT: return v->len == 2 && s[0] == '-' && s[1] == '0' ? out_raw(o, "0", 1) : out_raw(o, s, v->len);
    case J_FLOAT: {
        if (v->own_repr) return out_raw(o, s, v->len);
        char tmp[MAX_NUMBER + 1];
        memcpy(tmp, s, (size_t)v->len);
        tmp[v->len] = 0;
        double d = PyOS_string_to_double(tmp, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (Py_IS_INFINITY(d)) return d > 0 ? out_raw(o, "Infinity", 8) : out_raw(o, "-Infinity", 9);
        char *r = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!r) return -1;
        int ok = out_raw(o, r, (Py_ssize_t)strlen(r));
        PyMem_Free(r);
        return ok;
    }
    case J_STR: return dump_str(o, t->buf + v->off, v->len, ascii);
    default: break;
    }
    int32_t order[MAX_KEYS];
    Py_ssize_t n = 0;
    int obj = v->type == J_OBJ;
    if (out_raw(o, obj ? "{" : "[", 1) < 0) return -1;
    for (int32_t i = v->first; i >= 0; i = t->nodes[i].next) {
        if (obj && sort) { /* insertion sort: an object has at most MAX_KEYS members */
            Py_ssize_t j = n++;
            while (j > 0 && key_before(t, i, order[j - 1])) order[j] = order[j - 1], j--;
            order[j] = i;
            continue;
        }
        if ((n++ && out_raw(o, ", ", 2) < 0) ||
            (obj && (dump_str(o, t->buf + t->nodes[i].koff, t->nodes[i].klen, ascii) < 0 || out_raw(o, ": ", 2) < 0)) ||
            dump_value(o, t, i, sort, ascii) < 0)
            return -1;
    }
    for (Py_ssize_t j = 0; obj && sort && j < n; j++) {
        const Node *m = &t->nodes[order[j]];
        if ((j && out_raw(o, ", ", 2) < 0) || dump_str(o, t->buf + m->koff, m->klen, ascii) < 0 ||
            out_raw(o, ": ", 2) < 0 || dump_value(o, t, order[j], sort, ascii) < 0)
            return -1;
    }
    return out_raw(o, obj ? "}" : "]", 1);
}

/* json.dumps(parse_json(text), sort_keys=sort, ensure_ascii=ascii) as a new str in *out: 1 written, 0 declined (as
 * evidence_scan declines, or text that is not UTF-8 where it is written as it is), -1 error. */
static int json_dumped(const uint8_t *text, Py_ssize_t n, int sort, int ascii, PyObject **out) {
    const uint8_t *s, *e;
    int json = parse_json_span(text, n, &s, &e);
    if (json < 0) return 0;
    Out o = {NULL, 0, 0};
    Tree t = {NULL, 0, 0, NULL, 0, 0, text};
    int r = 1;
    if (!json) r = dump_str(&o, text, n, ascii) < 0 ? -1 : 1;
    else if ((r = parse(&t, s, e)) == 1 && dump_value(&o, &t, 0, sort, ascii) < 0) r = -1;
    if (r == 1) {
        *out = ascii ? PyUnicode_DecodeASCII((const char *)o.p, o.n, NULL)
                     : PyUnicode_DecodeUTF8((const char *)o.p, o.n, NULL);
        if (!*out) {
            r = -1;
            if (!ascii && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear(), r = 0;
        }
    }
    return finish(r, &o, &t);
}

/* json.dumps(parse_json(text), sort_keys=True) (the call identity's canonical arguments) as a new str in *out:
 * 1 written, 0 declined (as evidence_scan declines), -1 error. */
int json_canonical(const uint8_t *text, Py_ssize_t n, PyObject **out) {
    return json_dumped(text, n, 1, 1, out);
}

/* json.dumps(parse_json(text), ensure_ascii=False) (a tool call's row) as a new str in *out: 1 written, 0 declined,
 * -1 error. */
int json_row_text(const uint8_t *text, Py_ssize_t n, PyObject **out) {
    return json_dumped(text, n, 0, 0, out);
}

const char *const json_canonical_doc_text =
    "json_canonical(text) -> str | None\n\n"
    "json.dumps(parse_json(text), sort_keys=True) written from the text without Python objects; None where\n"
    "the reader declines the text.";

const char *const json_text_doc_text =
    "json_text(text) -> str | None\n\n"
    "json.dumps(parse_json(text), ensure_ascii=False) (a tool call's row) written from the text without Python\n"
    "objects; None where the reader declines the text.";

static PyObject *dumped_py(PyObject *arg, int sort, int ascii) {
    Py_buffer text;
    if (PyObject_GetBuffer(arg, &text, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL;
    int r = json_dumped(text.buf, text.len, sort, ascii, &out);
    PyBuffer_Release(&text);
    if (r < 0) return NULL;
    if (!r) Py_RETURN_NONE;
    return out;
}

PyObject *json_canonical_py(PyObject *self, PyObject *arg) {
    return dumped_py(arg, 1, 1);
}

PyObject *json_text_py(PyObject *self, PyObject *arg) {
    return dumped_py(arg, 0, 0);
}

/* ---- the spec -------------------------------------------------------------------------------- */

static void list_free(List *l) {
    if (l->items)
        for (Py_ssize_t i = 0; i < l->n; i++) PyMem_Free((void *)l->items[i].p);
    PyMem_Free(l->items);
    PyMem_Free(l->masks);
    PyMem_Free(l->confirmation);
    memset(l, 0, sizeof *l);
}

static void spec_free(PyObject *capsule) {
    Spec *sp = PyCapsule_GetPointer(capsule, SPEC_CAPSULE);
    if (!sp) return;
    List *lists[] = {&sp->presence, &sp->order_ids, &sp->bookings, &sp->order_objects, &sp->confirmed,
                     &sp->checkout_statuses, &sp->ok_phrases, &sp->failed_phrases};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) list_free(lists[i]);
    PyMem_Free(sp);
}

/* A tuple of strings, or of (string, int) pairs when ``with_int``: copied as UTF-8. */
static int list_of(PyObject *seq, List *l, int with_int, const char *what) {
    if (!PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple", what);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    l->items = PyMem_Calloc((size_t)n + 1, sizeof *l->items);
    l->masks = PyMem_Calloc((size_t)n + 1, sizeof *l->masks);
    l->confirmation = PyMem_Calloc((size_t)n + 1, 1);
    if (!l->items || !l->masks || !l->confirmation) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i), *s = item;
        long v = 0;
        if (with_int) {
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                PyErr_Format(PyExc_TypeError, "%s: (string, int) pairs", what);
                return -1;
            }
            s = PyTuple_GET_ITEM(item, 0);
            v = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
            if (v == -1 && PyErr_Occurred()) return -1;
        }
        Py_ssize_t len;
        const char *u = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &len) : NULL;
        if (!u) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s: strings", what);
            return -1;
        }
        uint8_t *copy = PyMem_Malloc((size_t)len + 1);
        if (!copy) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, u, (size_t)len + 1);
        l->items[i] = (Bytes){copy, len};
        l->masks[i] = (uint32_t)v;
        l->confirmation[i] = (uint8_t)(v != 0);
        l->n = i + 1;
    }
    return 0;
}

const char *const evidence_spec_doc_text =
    "evidence_spec(presence, order_ids, bookings, order_objects, confirmed, checkout_statuses, ok_phrases,\n"
    "              failed_phrases, bits) -> capsule\n\n"
    "What evidence_scan reads a result with: presence is ((key, mask), ...), bookings ((key, 1 if\n"
    "'confirmation' is in its lower case else 0), ...), the phrases lowered and ASCII, bits the masks of\n"
    "(order confirmed, order pending, checkout status, checkout page, options without ids).";

PyObject *evidence_spec(PyObject *self, PyObject *args) {
    PyObject *lists[8];
    unsigned int bits[5];
    if (!PyArg_ParseTuple(args, "OOOOOOOO(IIIII)", &lists[0], &lists[1], &lists[2], &lists[3], &lists[4], &lists[5],
                          &lists[6], &lists[7], &bits[0], &bits[1], &bits[2], &bits[3], &bits[4]))
        return NULL;
    Spec *sp = PyMem_Calloc(1, sizeof *sp);
    if (!sp) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(sp, SPEC_CAPSULE, spec_free);
    if (!capsule) {
        PyMem_Free(sp);
        return NULL;
    }
    static const char *const names[] = {"presence", "order_ids", "bookings", "order_objects", "confirmed",
                                        "checkout_statuses", "ok_phrases", "failed_phrases"};
    List *into[] = {&sp->presence, &sp->order_ids, &sp->bookings, &sp->order_objects, &sp->confirmed,
                    &sp->checkout_statuses, &sp->ok_phrases, &sp->failed_phrases};
    for (int i = 0; i < 8; i++)
        if (list_of(lists[i], into[i], i == 0 || i == 2, names[i]) < 0) {
            Py_DECREF(capsule);
            return NULL;
        }
    for (int i = 6; i < 8; i++)
        for (Py_ssize_t k = 0; k < into[i]->n; k++)
            for (Py_ssize_t j = 0; j < into[i]->items[k].n; j++) {
                uint8_t c = into[i]->items[k].p[j];
                if (c >= 0x80 || (c >= 'A' && c <= 'Z')) {
                    Py_DECREF(capsule);
                    PyErr_Format(PyExc_ValueError, "%s: lowered ASCII phrases", names[i]);
                    return NULL;
                }
            }
    sp->order_confirmed = bits[0], sp->order_pending = bits[1], sp->checkout_status = bits[2];
    sp->checkout_page = bits[3], sp->options_without_ids = bits[4];
    return capsule;
}

const char *const evidence_scan_doc_text =
    "evidence_scan(spec, text, failed) -> (mask, mentions payment) | None\n\n"
    "A tool result's evidence flags (0 when failed) and payment mention, read from its text as the\n"
    "reference reads the parsed value; None when this reader declines the text.";

PyObject *evidence_scan_py(PyObject *self, PyObject *args) {
    PyObject *capsule;
    Py_buffer text;
    int failed;
    if (!PyArg_ParseTuple(args, "Os*p", &capsule, &text, &failed)) return NULL;
    uint32_t mask;
    int payment;
    int r = evidence_scan(capsule, text.buf, text.len, failed, &mask, &payment);
    PyBuffer_Release(&text);
    if (r < 0) return NULL;
    if (!r) Py_RETURN_NONE;
    return Py_BuildValue("(IO)", mask, payment ? Py_True : Py_False);
}
