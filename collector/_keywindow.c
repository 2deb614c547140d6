/* The store's window of recent span, log record and metric point keys (store/dedupe.py), held compactly.
 *
 * A key is 25 bytes here: a hex key of up to 48 characters packed two to a byte with its length in front
 * (letters of either case read as the same digit, as Python's int(key, 16) reads them), or a 24-byte
 * digest of any other key (made by the caller) behind the tag 0xFF. Keys live in a ring in the order they
 * were added, and an open-addressing table of ring positions finds them (linear probing, with deletion by
 * backward shift, so the oldest can go without leaving tombstones). The table hashes with Python's own
 * keyed bytes hash, so keys that telemetry chose cannot be made to collide on purpose. A million keys take
 * about 35 MB; as Python ints in a dict they took about 95.
 *
 * Compiled into the _wire extension (see pyproject.toml); _wire.c adds the type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_BYTES 25
#define HEX_MAX 48
#define DIGEST_TAG 0xFF
#define MIN_CAP 1024
#define EMPTY UINT32_MAX
#define MAX_CAP ((size_t)1 << 31) /* ring positions are uint32, EMPTY above them */

typedef unsigned char Key[KEY_BYTES];

typedef struct {
    PyObject_HEAD
    Key *ring;       /* cap keys; the oldest at head, count of them in order */
    size_t cap, head, count;
    uint32_t *table; /* 2 * cap slots: a ring position, or EMPTY */
    size_t slots;
} KeyWindow;

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 1: packed; 0: not a key this window holds as is (the caller digests it); -1: an error is set. */
static int pack(PyObject *key, Key out) {
    memset(out, 0, KEY_BYTES);
    if (PyUnicode_Check(key)) {
        if (!PyUnicode_IS_ASCII(key) || PyUnicode_GET_LENGTH(key) > HEX_MAX) return 0;
        Py_ssize_t n = PyUnicode_GET_LENGTH(key);
        const unsigned char *s = PyUnicode_1BYTE_DATA(key);
        for (Py_ssize_t i = 0; i < n; i++) {
            int v = hex_digit(s[i]);
            if (v < 0) return 0;
            out[1 + i / 2] |= (unsigned char)(i & 1 ? v : v << 4);
        }
        out[0] = (unsigned char)n;
        return 1;
    }
    if (PyBytes_Check(key) && PyBytes_GET_SIZE(key) == KEY_BYTES - 1) {
        out[0] = DIGEST_TAG;
        memcpy(out + 1, PyBytes_AS_STRING(key), KEY_BYTES - 1);
        return 1;
    }
    return 0;
}

static size_t slot_of(const KeyWindow *w, const Key k) {
    return (size_t)_Py_HashBytes(k, KEY_BYTES) & (w->slots - 1);
}

/* The table slot holding this key, or the empty slot where it would go. */
static size_t find(const KeyWindow *w, const Key k, int *found) {
    size_t i = slot_of(w, k);
    for (;;) {
        uint32_t at = w->table[i];
        if (at == EMPTY) {
            *found = 0;
            return i;
        }
        if (memcmp(w->ring[at], k, KEY_BYTES) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & (w->slots - 1);
    }
}

static int contains(const KeyWindow *w, const Key k) {
    int found = 0;
    if (w->count) find(w, k, &found);
    return found;
}

/* Ring and table at a new capacity (a power of two, at least count), the keys in the same order; on failure the
 * window is as it was. */
static int resize(KeyWindow *w, size_t cap) {
    if (cap > MAX_CAP) {
        PyErr_SetString(PyExc_OverflowError, "a key window holds at most 2**31 keys");
        return -1;
    }
    Key *ring = PyMem_Malloc(cap * sizeof(Key));
    uint32_t *table = PyMem_Malloc(2 * cap * sizeof(uint32_t));
    if (!ring || !table) {
        PyMem_Free(ring);
        PyMem_Free(table);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < w->count; i++) memcpy(ring[i], w->ring[(w->head + i) & (w->cap - 1)], KEY_BYTES);
    memset(table, 0xFF, 2 * cap * sizeof(uint32_t));
    PyMem_Free(w->ring);
    PyMem_Free(w->table);
    w->ring = ring, w->table = table, w->cap = cap, w->slots = 2 * cap, w->head = 0;
    for (size_t i = 0; i < w->count; i++) {
        int found;
        w->table[find(w, ring[i], &found)] = (uint32_t)i;
    }
    return 0;
}

/* The key added unless held (room for it reserved by the caller). */
static void append(KeyWindow *w, const Key k) {
    int found;
    size_t slot = find(w, k, &found);
    if (found) return;
    size_t at = (w->head + w->count) & (w->cap - 1);
    memcpy(w->ring[at], k, KEY_BYTES);
    w->table[slot] = (uint32_t)at;
    w->count++;
}

/* Room for n more keys, made before any is added: a batch goes in whole or not at all. */
static int reserve(KeyWindow *w, size_t n) {
    size_t cap = w->cap ? w->cap : MIN_CAP;
    while (cap < w->count + n) {
        if (cap > MAX_CAP) break;
        cap *= 2;
    }
    return cap == w->cap ? 0 : resize(w, cap);
}

/* Let the oldest key go: its slot emptied, and the keys probing past it shifted back into place. */
static void drop_oldest(KeyWindow *w) {
    int found;
    size_t mask = w->slots - 1, hole = find(w, w->ring[w->head], &found);
    for (size_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
        uint32_t at = w->table[i];
        if (at == EMPTY) break;
        size_t home = slot_of(w, w->ring[at]);
        /* the key at i may move to the hole when its home is not cyclically within (hole, i] */
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            w->table[hole] = at;
            hole = i;
        }
    }
    w->table[hole] = EMPTY;
    w->head = (w->head + 1) & (w->cap - 1);
    w->count--;
}

/* Every key of the list packed (NULL, no error: one needs a digest first). */
static Key *packed(PyObject *keys, Py_ssize_t *n) {
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return NULL;
    }
    *n = PyList_GET_SIZE(keys);
    Key *out = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof(Key));
    if (!out) return (Key *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (!pack(PyList_GET_ITEM(keys, i), out[i])) {
            PyMem_Free(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *unpackable(void) {
    PyErr_SetString(PyExc_ValueError, "a key is neither hex of at most 48 characters nor a 24-byte digest");
    return NULL;
}

static int KeyWindow_init(KeyWindow *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, "")) return -1;
    PyMem_Free(self->ring);
    PyMem_Free(self->table);
    self->ring = NULL, self->table = NULL, self->cap = self->slots = self->count = self->head = 0;
    return resize(self, MIN_CAP);
}

static void KeyWindow_dealloc(KeyWindow *self) {
    PyMem_Free(self->ring);
    PyMem_Free(self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *KeyWindow_fresh_mask(KeyWindow *self, PyObject *keys) {
    Py_ssize_t n;
    Key *ks = packed(keys, &n);
    if (!ks) return PyErr_Occurred() ? NULL : unpackable();
    /* the batch's own keys, to tell a key given twice: a table of indexes into ks */
    size_t slots = 2;
    while (slots < 2 * (size_t)n) slots <<= 1;
    uint32_t *seen = PyMem_Malloc(slots * sizeof(uint32_t));
    unsigned char *fresh = PyMem_Malloc((size_t)(n ? n : 1));
    if (!seen || !fresh) {
        PyMem_Free(ks), PyMem_Free(seen), PyMem_Free(fresh);
        return PyErr_NoMemory();
    }
    memset(seen, 0xFF, slots * sizeof(uint32_t));
    int all_fresh = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t j = (size_t)_Py_HashBytes(ks[i], KEY_BYTES) & (slots - 1);
        int again = 0;
        for (; seen[j] != EMPTY; j = (j + 1) & (slots - 1))
            if (memcmp(ks[seen[j]], ks[i], KEY_BYTES) == 0) {
                again = 1;
                break;
            }
        if (!again) seen[j] = (uint32_t)i;
        fresh[i] = !again && !contains(self, ks[i]);
        all_fresh &= fresh[i];
    }
    PyObject *out = Py_None;
    if (all_fresh) {
        Py_INCREF(out);
    } else if ((out = PyList_New(n))) {
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(out, i, PyBool_FromLong(fresh[i]));
    }
    PyMem_Free(ks), PyMem_Free(seen), PyMem_Free(fresh);
    return out;
}

static PyObject *KeyWindow_add(KeyWindow *self, PyObject *keys) {
    Py_ssize_t n;
    Key *ks = packed(keys, &n);
    if (!ks) return PyErr_Occurred() ? NULL : unpackable();
    size_t before = self->count;
    if (reserve(self, (size_t)n) < 0) {
        PyMem_Free(ks);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) append(self, ks[i]);
    PyMem_Free(ks);
    return PyLong_FromSize_t(self->count - before);
}

static PyObject *KeyWindow_evict(KeyWindow *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "evict(%zd): not a count", n);
    size_t gone = 0;
    for (; (Py_ssize_t)gone < n && self->count; gone++) drop_oldest(self);
    /* a window that emptied out gives most of its memory back */
    size_t cap = self->cap;
    while (cap > MIN_CAP && self->count < cap / 4) cap /= 2;
    if (cap < self->cap && resize(self, cap) < 0) PyErr_Clear(); /* kept at its size: the keys went all the same */
    return PyLong_FromSize_t(gone);
}

static int KeyWindow_contains(KeyWindow *self, PyObject *key) {
    Key k;
    int ok = pack(key, k);
    return ok <= 0 ? ok : contains(self, k);
}

static Py_ssize_t KeyWindow_len(KeyWindow *self) { return (Py_ssize_t)self->count; }

static PyObject *KeyWindow_bytes(KeyWindow *self, PyObject *unused) {
    return PyLong_FromSize_t(self->cap * sizeof(Key) + self->slots * sizeof(uint32_t));
}

static PyMethodDef KeyWindow_methods[] = {
    {"fresh_mask", (PyCFunction)KeyWindow_fresh_mask, METH_O,
     "fresh_mask(keys: list) -> None when every key is neither held nor earlier in the list, else a list of\n"
     "bools saying which are. ValueError: a key needs a digest first."},
    {"add", (PyCFunction)KeyWindow_add, METH_O,
     "add(keys: list) -> how many were added, newest last (a key held already keeps its place)."},
    {"evict", (PyCFunction)KeyWindow_evict, METH_O, "evict(n) -> how many of the oldest keys went (at most n)."},
    {"bytes", (PyCFunction)KeyWindow_bytes, METH_NOARGS, "bytes() -> what the ring and table take."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods KeyWindow_sequence = {
    .sq_length = (lenfunc)KeyWindow_len,
    .sq_contains = (objobjproc)KeyWindow_contains,
};

static PyTypeObject KeyWindowType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "agentfunnel.collector._wire.KeyWindow",
    .tp_basicsize = sizeof(KeyWindow),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyWindow(): keys in the order added, each held in 25 bytes (hex keys packed, others as a digest).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyWindow_init,
    .tp_dealloc = (destructor)KeyWindow_dealloc,
    .tp_methods = KeyWindow_methods,
    .tp_as_sequence = &KeyWindow_sequence,
};

int add_key_window(PyObject *module) {
    if (PyType_Ready(&KeyWindowType) < 0) return -1;
    if (PyModule_AddIntConstant(module, "KEY_HEX_MAX", HEX_MAX) < 0) return -1; /* longer keys are digested first */
    return PyModule_AddObjectRef(module, "KeyWindow", (PyObject *)&KeyWindowType);
}
