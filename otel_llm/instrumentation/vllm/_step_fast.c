/* Optional C accelerator of the EngineCore's per-step path: step_wire.encode, and the copy of the record
 * into each frontend's shared-memory ring (shm_ring.RingWriter.write), in one call. And of the frontend's:
 * step_wire.decode of the common record (see "the frontend's side" below).
 *
 * Byte-identical to the Python path by construction where it matters: this module encodes only input it
 * fully understands (tuples, lists, ints, floats in the wire's ranges) and checks all of it BEFORE
 * touching the sender's cache; anything else (a count >= 2^32, a NUL in an id, an unexpected type...) is
 * handed whole to the Python encoder (step_wire.encode_py), which produces the same bytes or raises the same
 * error as it always did. Tests compare both paths record by record and ring byte by ring byte.
 *
 * step_wire.py is the one module that chooses this or Python (step_wire.FAST, REASON), and only on x86-64
 * (the ring's memory-ordering contract below, and the wire's little-endian u32 as the native layout).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>

#define HEADER_SIZE 99 /* step_wire.HEADER "<BBqddIIIdBdddddIII": checked against it by setup() */
/* the highest queue_blocked a reader takes: timeline.BLOCKED_STRUCTURED_OUTPUT (step_wire.BLOCKED_LAST);
 * this file's layout (offsets, flags, slots, this) is checked against the Python declarations by
 * tests/vllm/test_c_layout.py */
#define BLOCKED_LAST 5
#define F_IDLE 1
#define F_MODEL 2
#define F_ONE_EACH 4
#define F_SAME_IDS 8
#define F_EXTRAS 16 /* step_wire._EXTRAS: speculative drafts, LoRA adapters; encoded here, decoded in Python */
/* step_wire._GRAMMAR (32): a structured-output step's grammar block, encoded and decoded in Python (a payload of
 * 16 fields is not taken here; an unknown flag is handed to the Python decoder) */
/* any other flag (the extras): the Python decoder */
#define F_KNOWN (F_IDLE | F_MODEL | F_ONE_EACH | F_SAME_IDS)
#define EXTRA_COUNTS_SIZE 20 /* step_wire._EXTRA_COUNTS "<IIId" */

static PyObject *py_encode;    /* step_wire.encode_py: every input the fast path does not take */
static int wire_version;
static Py_ssize_t ring_data;   /* shm_ring: offset of the data, and of the head/tail words */
static Py_ssize_t ring_head, ring_tail;
static PyObject *s_mm, *s_cap, *s_head, *s_written;

/* one growable scratch buffer for the counts and one for the record (the GIL is held throughout, and
 * nothing in here calls back into code that could re-enter this module) */
static uint32_t *vals;
static Py_ssize_t vals_cap;
static unsigned char *rec;
static Py_ssize_t rec_cap;

typedef struct {
    long long step_id;
    double start, end, kv, schedule_s, execute_s, output_s, idle, model;
    uint32_t running, waiting, preempted, n, z, m;
    uint8_t flags, blocked;
    Py_ssize_t nvals;     /* u32 values in vals */
    /* the extras block (F_EXTRAS; no LoRA events: a step with some goes to the Python path): its counts,
     * then ex_vals u32 values in vals after the shares' */
    uint32_t ex_spec, ex_loras;
    double ex_draft;
    Py_ssize_t ex_vals;
    PyObject *joined;     /* new reference or NULL (no id bytes) */
} record_t;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap)
        return 0;
    Py_ssize_t want = need < 256 ? 256 : need * 2;
    void *q = PyMem_Realloc(*p, (size_t)want * item);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = want;
    return 0;
}

/* struct's 'd' for the values the hooks pass (exact floats); 0: not taken (the Python path decides) */
static int get_double(PyObject *o, double *out) {
    if (!PyFloat_CheckExact(o))
        return 0;
    *out = PyFloat_AS_DOUBLE(o);
    return 1;
}

static int get_uint(PyObject *o, unsigned long long limit, unsigned long long *out) {
    if (!PyLong_Check(o))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v < 0 || (unsigned long long)v > limit) {
        if (v == -1 && PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    *out = (unsigned long long)v;
    return 1;
}

/* `x or 0.0` of an optional seconds value; flag set when it is not None */
static int get_optional(PyObject *o, double *out, uint8_t *flags, uint8_t bit) {
    if (o == Py_None) {
        *out = 0.0;
        return 1;
    }
    *flags |= bit;
    if (!get_double(o, out))
        return 0;
    if (*out == 0.0)
        *out = 0.0; /* -0.0 is falsy in Python: `-0.0 or 0.0` packs +0.0 */
    return 1;
}

static int seq(PyObject *o) { return PyList_CheckExact(o) || PyTuple_CheckExact(o); }

static int put_counts(PyObject *o, Py_ssize_t *at) {
    Py_ssize_t k = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < k; i++) {
        unsigned long long v;
        if (!get_uint(items[i], 0xFFFFFFFFull, &v))
            return 0;
        vals[(*at)++] = (uint32_t)v;
    }
    return 1;
}

/* step_wire._extras_bytes of (spec_at, drafted, accepted, loras, events, draft) after the shares' counts in
 * vals: 1 taken; 0 not (LoRA events, counts that do not line up, a value out of range: the Python path raises
 * or encodes them), nothing changed that matters (vals is scratch) */
static int prepare_extras(PyObject *extras, record_t *r) {
    PyObject **x = &PyTuple_GET_ITEM(extras, 0);
    for (int i = 0; i < 5; i++)
        if (!seq(x[i]))
            return 0;
    if (PySequence_Fast_GET_SIZE(x[4]))
        return 0; /* adapter loads or evictions: rare, the Python path */
    Py_ssize_t spec = PySequence_Fast_GET_SIZE(x[0]), loras = PySequence_Fast_GET_SIZE(x[3]);
    if (PySequence_Fast_GET_SIZE(x[1]) != spec || PySequence_Fast_GET_SIZE(x[2]) != spec || loras > 0xFFFFFFFFll)
        return 0;
    if (x[5] == Py_None) {
        /* Python's float("nan"), bit for bit (C's NAN need not be the same NaN) */
        uint64_t bits = 0x7ff8000000000000ull;
        memcpy(&r->ex_draft, &bits, sizeof bits);
    } else if (!get_double(x[5], &r->ex_draft)) {
        return 0;
    }
    Py_ssize_t at = r->nvals;
    if (grow((void **)&vals, &vals_cap, at + 3 * spec + loras, sizeof(uint32_t)) < 0) {
        PyErr_Clear();
        return 0;
    }
    for (int i = 0; i < 4; i++)
        if (!put_counts(x[i], &r->nvals))
            return 0;
    for (Py_ssize_t i = 0; i < spec; i++)
        if (vals[at + i] >= r->n)
            return 0; /* a share index past the step's shares: the Python path's WireError */
    r->ex_spec = (uint32_t)spec, r->ex_loras = (uint32_t)loras;
    r->ex_vals = r->nvals - at;
    r->nvals = at; /* the shares' counts; the extras' follow them in vals */
    return 1;
}

/* 1: r filled (and the cache updated as step_wire.encode_py would); 0: not taken, nothing changed (no
 * exception set); -1: an exception (the same one the Python path raises at the same point) */
static int prepare(PyObject *payload, PyObject *cache, int same_ids, record_t *r) {
    r->joined = NULL;
    if (py_encode == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_step_fast.setup was not called (step_wire does it)");
        return -1;
    }
    r->flags = 0;
    r->ex_vals = 0;
    /* step_wire.StepPayload and Shares: tuples (NamedTuple subclasses, or plain ones) of 14 and 7 fields; a
     * 15th, step_wire.Extras (6 fields), in a step with speculative drafts or LoRA adapters */
    Py_ssize_t fields = PyTuple_Check(payload) ? PyTuple_GET_SIZE(payload) : 0;
    if (fields != 14 && fields != 15)
        return 0;
    PyObject *extras = fields == 15 ? PyTuple_GET_ITEM(payload, 14) : NULL;
    if (extras != NULL && (!PyTuple_Check(extras) || PyTuple_GET_SIZE(extras) != 6))
        return 0;
    PyObject **p = &PyTuple_GET_ITEM(payload, 0);
    PyObject *shares = p[7];
    if (!PyTuple_Check(shares) || PyTuple_GET_SIZE(shares) != 7)
        return 0;
    PyObject **s = &PyTuple_GET_ITEM(shares, 0);
    PyObject *ids = s[0], *tokens = s[1];
    for (int i = 2; i < 7; i++)
        if (!seq(s[i]))
            return 0;
    if (!seq(ids) || (tokens != Py_None && !seq(tokens)))
        return 0;
    /* the ids cache: step_wire.sender_cache(), a list of three (anything else: the Python path says why) */
    if (cache != Py_None && (!PyList_CheckExact(cache) || PyList_GET_SIZE(cache) != 3))
        return 0;
    /* the header */
    int overflow;
    if (!PyLong_Check(p[0]))
        return 0;
    r->step_id = PyLong_AsLongLongAndOverflow(p[0], &overflow);
    if (overflow || r->step_id == LLONG_MIN) { /* (step_id - 1 below) */
        if (PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    unsigned long long u;
    if (!get_double(p[1], &r->start) || !get_double(p[2], &r->end) || !get_double(p[6], &r->kv)
        || !get_double(p[9], &r->schedule_s) || !get_double(p[10], &r->execute_s) || !get_double(p[11], &r->output_s))
        return 0;
    if (!get_uint(p[3], 0xFFFFFFFFull, &u)) return 0;
    r->running = (uint32_t)u;
    if (!get_uint(p[4], 0xFFFFFFFFull, &u)) return 0;
    r->waiting = (uint32_t)u;
    if (!get_uint(p[5], 0xFFFFFFFFull, &u)) return 0;
    r->preempted = (uint32_t)u;
    if (!get_uint(p[8], 0xFFull, &u)) return 0;
    r->blocked = (uint8_t)u;
    if (!get_optional(p[12], &r->idle, &r->flags, F_IDLE) || !get_optional(p[13], &r->model, &r->flags, F_MODEL))
        return 0;
    if (tokens == Py_None)
        r->flags |= F_ONE_EACH;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids), z = PySequence_Fast_GET_SIZE(s[3]),
               m = PySequence_Fast_GET_SIZE(s[4]);
    if (n > 0xFFFFFFFFll)
        return 0;
    r->n = (uint32_t)n, r->z = (uint32_t)z, r->m = (uint32_t)m;
    r->nvals = 0;
    if (extras != NULL) {
        if (!n)
            return 0; /* extras of an empty step: the Python path says what it makes of them */
        r->flags |= F_EXTRAS;
    }
    if (!n)
        return 1; /* the header alone: no ids, no counts, cache untouched */
    /* the counts: array("I", computed) for a plain decode batch (any length, as array takes it), else the
     * struct of exactly k + n + z + 3m values, the lists concatenated (as `pack(*a, *b, ...)` takes them) */
    /* compared first (no side effect; with ids of str only it runs no Python code): from here on until the
     * record is emitted nothing runs Python code that could re-enter this module and reuse `vals` */
    int same = 0;
    if (cache != Py_None) {
        same = PyObject_RichCompareBool(PyList_GET_ITEM(cache, 0), ids, Py_EQ);
        if (same < 0)
            return -1;
    }
    int plain = tokens == Py_None && !z && !m;
    int first = tokens == Py_None ? 2 : 1, last = plain ? 3 : 7;
    Py_ssize_t total = 0;
    for (int i = first; i < last; i++)
        total += PySequence_Fast_GET_SIZE(s[i]);
    if (!plain && total != (tokens == Py_None ? 0 : n) + n + z + 3 * m)
        return 0;
    if (grow((void **)&vals, &vals_cap, total, sizeof(uint32_t)) < 0)
        return -1;
    for (int i = first; i < last; i++)
        if (!put_counts(s[i], &r->nvals))
            return 0;
    if (extras != NULL && !prepare_extras(extras, r))
        return 0;
    /* the ids: as step_wire.encode_py, the cache last (everything above could still refuse) */
    if (same) {
        PyObject *bytes = PyList_GET_ITEM(cache, 1);
        if (!PyBytes_CheckExact(bytes))
            return 0;
        if (!same_ids) {
            r->joined = Py_NewRef(bytes);
            return 1;
        }
        PyObject *last = PyList_GET_ITEM(cache, 2);
        int follows = 0;
        if (PyLong_CheckExact(last)) {
            long long v = PyLong_AsLongLongAndOverflow(last, &overflow);
            if (v == -1 && PyErr_Occurred())
                PyErr_Clear();
            follows = !overflow && v == r->step_id - 1;
        } else if (last != Py_None) {
            return 0;
        }
        PyObject *sid = PyLong_FromLongLong(r->step_id);
        if (sid == NULL)
            return -1;
        if (follows)
            r->flags |= F_SAME_IDS;
        else
            r->joined = Py_NewRef(bytes);
        PyList_SetItem(cache, 2, sid); /* steals sid */
        return 1;
    }
    static PyObject *nul;
    if (nul == NULL && (nul = PyUnicode_FromStringAndSize("\0", 1)) == NULL)
        return -1;
    PyObject *text = PyUnicode_Join(nul, ids);
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *joined = PyUnicode_AsUTF8String(text);
    Py_DECREF(text);
    if (joined == NULL) {
        PyErr_Clear();
        return 0;
    }
    /* an id with a NUL in it: the Python path raises WireError (UTF-8 has a 0 byte only for U+0000) */
    const char *b = PyBytes_AS_STRING(joined), *e = b + PyBytes_GET_SIZE(joined);
    Py_ssize_t nuls = 0;
    while ((b = memchr(b, 0, (size_t)(e - b))) != NULL) {
        nuls++;
        b++;
    }
    if (nuls != n - 1) {
        Py_DECREF(joined);
        return 0;
    }
    if (cache != Py_None) {
        PyObject *sid = NULL;
        if (same_ids && (sid = PyLong_FromLongLong(r->step_id)) == NULL) {
            Py_DECREF(joined);
            return -1;
        }
        PyList_SetItem(cache, 0, Py_NewRef(ids));
        PyList_SetItem(cache, 1, Py_NewRef(joined));
        if (sid != NULL)
            PyList_SetItem(cache, 2, sid);
    }
    r->joined = joined;
    return 1;
}

static Py_ssize_t record_size(const record_t *r) {
    return HEADER_SIZE + 4 * r->nvals + (r->flags & F_EXTRAS ? EXTRA_COUNTS_SIZE + 4 * r->ex_vals : 0)
           + (r->joined ? PyBytes_GET_SIZE(r->joined) : 0);
}

#define PUT(v) (memcpy(out, &(v), sizeof(v)), out += sizeof(v))

/* little-endian fields, no padding: x86-64's own layout (step_wire.py checks the platform) */
static void emit(const record_t *r, unsigned char *out) {
    uint8_t version = (uint8_t)wire_version;
    PUT(version); PUT(r->flags); PUT(r->step_id); PUT(r->start); PUT(r->end);
    PUT(r->running); PUT(r->waiting); PUT(r->preempted); PUT(r->kv); PUT(r->blocked);
    PUT(r->schedule_s); PUT(r->execute_s); PUT(r->output_s); PUT(r->idle); PUT(r->model);
    PUT(r->n); PUT(r->z); PUT(r->m);
    if (r->nvals) {
        memcpy(out, vals, 4 * (size_t)r->nvals);
        out += 4 * r->nvals;
    }
    if (r->flags & F_EXTRAS) { /* the shares' counts, then the extras, then the ids: as encode_py */
        uint32_t events = 0;
        PUT(r->ex_spec); PUT(r->ex_loras); PUT(events); PUT(r->ex_draft);
        memcpy(out, vals + r->nvals, 4 * (size_t)r->ex_vals);
        out += 4 * r->ex_vals;
    }
    if (r->joined)
        memcpy(out, PyBytes_AS_STRING(r->joined), (size_t)PyBytes_GET_SIZE(r->joined));
}

static PyObject *encode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *payload, *cache = Py_None;
    int same_ids = 0;
    if (!PyArg_ParseTuple(args, "O|Op:encode", &payload, &cache, &same_ids))
        return NULL;
    record_t r;
    int ok = prepare(payload, cache, same_ids, &r);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        return PyObject_CallFunctionObjArgs(py_encode, payload, cache, same_ids ? Py_True : Py_False, NULL);
    PyObject *out = PyBytes_FromStringAndSize(NULL, record_size(&r));
    if (out != NULL)
        emit(&r, (unsigned char *)PyBytes_AS_STRING(out));
    Py_XDECREF(r.joined);
    return out;
}

static int get_size(PyObject *o, const char *what, unsigned long long *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "ring writer's %s is not an int", what);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(o);
    return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* shm_ring.RingWriter.write in C: 1 written, 0 full (dropped), -1 exception. Same bytes, same positions. */
static int ring_put(PyObject *writer, const unsigned char *data, Py_ssize_t size) {
    PyObject *mm = PyObject_GetAttr(writer, s_mm);
    if (mm == NULL)
        return -1;
    Py_buffer view;
    int got = PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE); /* fails on a closed mmap: never a dangling pointer */
    Py_DECREF(mm);
    if (got < 0)
        return -1;
    int result = -1;
    unsigned long long cap, head, written;
    PyObject *o = PyObject_GetAttr(writer, s_cap);
    if (o == NULL || get_size(o, "cap", &cap) < 0)
        goto done;
    Py_DECREF(o);
    o = PyObject_GetAttr(writer, s_head);
    if (o == NULL || get_size(o, "head", &head) < 0)
        goto done;
    Py_DECREF(o);
    o = NULL;
    /* cap and head are the writer's own (never read from the shared memory); checked anyway, so that no
     * position below can fall outside the mapping */
    if (cap == 0 || cap % 4 || head % 4 || view.len < ring_data + (Py_ssize_t)cap
        || (unsigned long long)size > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_ValueError, "step ring of another size than its writer says");
        goto done;
    }
    unsigned char *base = view.buf;
    unsigned char *data_at = base + ring_data;
    /* Memory ordering (shm_ring's module docstring). The reader publishes `tail` after copying records out:
     * the acquire load pairs with its store, so our writes into that space come after its reads of it. The
     * record's bytes are written first, then `head` with a release store: a reader that loads `head` (and
     * acquires it) sees every byte of the record. On x86-64 both compile to plain moves; the builtins keep
     * the compiler from reordering or tearing them (8-byte aligned words: offsets 16 and 24 of a page). */
    uint64_t tail = __atomic_load_n((uint64_t *)(base + ring_tail), __ATOMIC_ACQUIRE);
    unsigned long long end = head + (((unsigned long long)size + 7) & ~3ull);
    /* The reader's tail is untrusted (read once, into `tail`): a record is written only where
     * end - cap <= tail <= head, as RingWriter.write. That bounds the record by the free space, and so by the
     * capacity, whatever tail says: a tail beyond head (which no reader publishes) refuses, never skips it. */
    if (tail > head || end - tail > cap) {
        result = 0;
        goto done;
    }
    unsigned long long at = head % cap;
    uint32_t size32 = (uint32_t)size;
    memcpy(data_at + at, &size32, 4); /* never straddles the end: positions and capacity are multiples of 4 */
    at += 4;
    if (at + (unsigned long long)size <= cap) {
        memcpy(data_at + at, data, (size_t)size);
    } else {
        size_t first = (size_t)(cap - at);
        memcpy(data_at + at, data, first);
        memcpy(data_at, data + first, (size_t)size - first);
    }
    __atomic_store_n((uint64_t *)(base + ring_head), (uint64_t)end, __ATOMIC_RELEASE);
    o = PyLong_FromUnsignedLongLong(end);
    if (o == NULL || PyObject_SetAttr(writer, s_head, o) < 0)
        goto done;
    Py_DECREF(o);
    o = PyObject_GetAttr(writer, s_written);
    if (o == NULL || get_size(o, "written", &written) < 0)
        goto done;
    Py_DECREF(o);
    o = PyLong_FromUnsignedLongLong(written + 1);
    if (o == NULL || PyObject_SetAttr(writer, s_written, o) < 0)
        goto done;
    result = 1;
done:
    Py_XDECREF(o);
    PyBuffer_Release(&view);
    return result;
}

/* encode_into_rings(payload, cache, writers): the record encoded (as encode) and copied into each
 * RingWriter's ring (as RingWriter.write); returns how many rings were full (the record dropped there). */
static PyObject *encode_into_rings(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *payload, *cache, *writers;
    if (!PyArg_ParseTuple(args, "OOO!:encode_into_rings", &payload, &cache, &PyTuple_Type, &writers))
        return NULL;
    record_t r;
    int ok = prepare(payload, cache, 1, &r); /* every reader has a ring of its own: ids may be left out */
    if (ok < 0)
        return NULL;
    PyObject *fallback = NULL;
    const unsigned char *data;
    Py_ssize_t size;
    if (ok == 0) {
        fallback = PyObject_CallFunctionObjArgs(py_encode, payload, cache, Py_True, NULL);
        if (fallback == NULL)
            return NULL;
        if (!PyBytes_Check(fallback)) {
            Py_DECREF(fallback);
            PyErr_SetString(PyExc_TypeError, "step_wire.encode_py returned no bytes");
            return NULL;
        }
        data = (const unsigned char *)PyBytes_AS_STRING(fallback);
        size = PyBytes_GET_SIZE(fallback);
    } else {
        size = record_size(&r);
        if (grow((void **)&rec, &rec_cap, size, 1) < 0) {
            Py_XDECREF(r.joined);
            return NULL;
        }
        emit(&r, rec);
        Py_XDECREF(r.joined);
        data = rec;
    }
    long full = 0;
    Py_ssize_t k = PyTuple_GET_SIZE(writers);
    for (Py_ssize_t i = 0; i < k; i++) {
        int put = ring_put(PyTuple_GET_ITEM(writers, i), data, size);
        if (put < 0) {
            Py_XDECREF(fallback);
            return NULL;
        }
        full += !put;
    }
    Py_XDECREF(fallback);
    return PyLong_FromLong(full);
}


/* ---- the frontend's side: step_wire.decode of the common record, straight into a StepRecord ----
 *
 * Taken only when the record is valid and no share prefills (no no_output_at, no prompt entries: every
 * steady decode batch, and most mixed ones listing tokens); anything else, including every record the
 * Python decoder refuses, is handed whole to step_wire.decode_py, which decodes it or raises as it always
 * did. The record's slots are set exactly as StepRecord.of_lists + decode_py set them (the tests compare
 * every slot and the reader's cache afterwards). The reader's cache is touched only once the record is
 * known to be taken. Little-endian wire = native layout: x86-64 only (step_wire chooses). */

static PyObject *py_decode;    /* step_wire.decode_py */
static PyObject *record_type;  /* core.timeline.StepRecord */
static PyObject *no_prefill;   /* step_wire._NONE: the shared empty prefill_at */
static PyObject *no_links;     /* timeline._NO_LINKS */
#define N_SLOTS 25
static PyObject *slot_names[N_SLOTS];
static const char *slot_strs[N_SLOTS] = {
    "step_id", "start", "end", "ids", "tokens", "prefill_at", "running", "waiting", "preempted",
    "kv_cache_usage", "attributes", "queue_blocked", "seq", "links", "schedule_s", "execute_s",
    "output_s", "idle_s", "model_s", "contexts", "members", "spec", "loras", "worker", "grammar"};

static PyObject *fallback(PyObject *data, PyObject *cache) {
    return PyObject_CallFunctionObjArgs(py_decode, data, cache, NULL);
}

static PyObject *u32_list(const unsigned char *p, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        PyObject *o = PyLong_FromUnsignedLong(v);
        if (o == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, o);
    }
    return list;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data, *cache = Py_None;
    if (!PyArg_ParseTuple(args, "O|O:decode", &data, &cache))
        return NULL;
    if (record_type == NULL || !PyBytes_CheckExact(data)
        || (cache != Py_None && (!PyList_CheckExact(cache) || PyList_GET_SIZE(cache) != 3)))
        return fallback(data, cache);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    if (len < HEADER_SIZE || b[0] != wire_version)
        return fallback(data, cache);
    uint8_t flags = b[1], blocked;
    long long step_id;
    double start, end, kv, schedule_s, execute_s, output_s, idle, model;
    uint32_t running, waiting, preempted, n, z, m;
    memcpy(&step_id, b + 2, 8);
    memcpy(&start, b + 10, 8);
    memcpy(&end, b + 18, 8);
    memcpy(&running, b + 26, 4);
    memcpy(&waiting, b + 30, 4);
    memcpy(&preempted, b + 34, 4);
    memcpy(&kv, b + 38, 8);
    blocked = b[46];
    memcpy(&schedule_s, b + 47, 8);
    memcpy(&execute_s, b + 55, 8);
    memcpy(&output_s, b + 63, 8);
    memcpy(&idle, b + 71, 8);
    memcpy(&model, b + 79, 8);
    memcpy(&n, b + 87, 4);
    memcpy(&z, b + 91, 4);
    memcpy(&m, b + 95, 4);
    if (n == 0 || z || m || (flags & ~F_KNOWN) || blocked > BLOCKED_LAST)  /* no shares, prefilling shares to
                                            derive, extras, a queue_blocked it does not know: the Python path */
        return fallback(data, cache);
    Py_ssize_t k = (flags & F_ONE_EACH) ? 0 : (Py_ssize_t)n;
    Py_ssize_t at = HEADER_SIZE + 4 * (k + (Py_ssize_t)n);
    Py_ssize_t cache_len = cache == Py_None ? 0 : PyList_GET_SIZE(cache);
    PyObject *ids = NULL, *raw = NULL;  /* new references */
    if (flags & F_SAME_IDS) {
        if (cache_len < 3 || len != at)
            return fallback(data, cache);
        PyObject *last = PyList_GET_ITEM(cache, 2);
        if (!PyLong_CheckExact(last) || step_id == LLONG_MIN)
            return fallback(data, cache);
        int overflow;
        long long l = PyLong_AsLongLongAndOverflow(last, &overflow);
        if (overflow || (l == -1 && PyErr_Occurred()) || l != step_id - 1) {
            PyErr_Clear();
            return fallback(data, cache);
        }
        ids = PyList_GET_ITEM(cache, 1);
        if (!PyList_CheckExact(ids) || PyList_GET_SIZE(ids) != (Py_ssize_t)n)
            return fallback(data, cache);
        Py_INCREF(ids);
    } else {
        if (len <= at)
            return fallback(data, cache);
        const char *text = (const char *)b + at;
        Py_ssize_t size = len - at;
        if (cache_len >= 2) {
            PyObject *known = PyList_GET_ITEM(cache, 0);
            if (PyBytes_CheckExact(known) && PyBytes_GET_SIZE(known) == size
                && memcmp(PyBytes_AS_STRING(known), text, (size_t)size) == 0) {
                ids = PyList_GET_ITEM(cache, 1);
                if (!PyList_CheckExact(ids))
                    return fallback(data, cache);
                Py_INCREF(ids);
            }
        }
        if (ids == NULL) {
            /* count the separators first: a wrong count is the Python decoder's WireError */
            Py_ssize_t seps = 0;
            for (Py_ssize_t i = 0; i < size; i++)
                seps += text[i] == 0;
            if (seps != (Py_ssize_t)n - 1)
                return fallback(data, cache);
            ids = PyList_New(n);
            if (ids == NULL)
                return NULL;
            Py_ssize_t from = 0, j = 0;
            for (Py_ssize_t i = 0; i <= size; i++) {
                if (i == size || text[i] == 0) {
                    PyObject *id = PyUnicode_DecodeUTF8(text + from, i - from, NULL);
                    if (id == NULL) {  /* not UTF-8: the Python decoder raises it */
                        Py_DECREF(ids);
                        PyErr_Clear();
                        return fallback(data, cache);
                    }
                    PyList_SET_ITEM(ids, j++, id);
                    from = i + 1;
                }
            }
        }
        if (cache_len >= 2 && (raw = PyBytes_FromStringAndSize(text, size)) == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
    }
    PyObject *tokens = k ? u32_list(b + HEADER_SIZE, k) : Py_NewRef(Py_None);
    PyObject *contexts = tokens ? u32_list(b + HEADER_SIZE + 4 * k, n) : NULL;
    /* StepRecord.__new__(StepRecord) (a class with __slots__: object's allocation, no __init__) */
    PyTypeObject *type = (PyTypeObject *)record_type;
    PyObject *step = contexts ? type->tp_alloc(type, 0) : NULL;
    PyObject *values[N_SLOTS] = {NULL};
    int ok = step != NULL;
    if (ok) {
        PyObject *v[N_SLOTS] = {
            PyLong_FromLongLong(step_id), PyFloat_FromDouble(start), PyFloat_FromDouble(end), Py_NewRef(ids),
            Py_NewRef(tokens), Py_NewRef(no_prefill), PyLong_FromUnsignedLong(running),
            PyLong_FromUnsignedLong(waiting), PyLong_FromUnsignedLong(preempted), PyFloat_FromDouble(kv),
            Py_NewRef(Py_None), PyLong_FromLong(blocked), PyLong_FromLong(0), Py_NewRef(no_links),
            PyFloat_FromDouble(schedule_s), PyFloat_FromDouble(execute_s), PyFloat_FromDouble(output_s),
            (flags & F_IDLE) ? PyFloat_FromDouble(idle) : Py_NewRef(Py_None),
            (flags & F_MODEL) ? PyFloat_FromDouble(model) : Py_NewRef(Py_None), Py_NewRef(contexts),
            Py_NewRef(Py_None), Py_NewRef(Py_None), Py_NewRef(Py_None), Py_NewRef(Py_None), Py_NewRef(Py_None)};
        for (int i = 0; i < N_SLOTS; i++) {
            values[i] = v[i];
            if (ok && (v[i] == NULL || PyObject_SetAttr(step, slot_names[i], v[i]) < 0))
                ok = 0;
        }
    }
    for (int i = 0; i < N_SLOTS; i++)
        Py_XDECREF(values[i]);
    if (ok && cache_len >= 2) {  /* taken: the reader's cache, as decode_py leaves it */
        if (raw != NULL) {
            PyObject *ids_ref = Py_NewRef(ids);
            if (PyList_SetItem(cache, 0, raw) < 0 || PyList_SetItem(cache, 1, ids_ref) < 0)
                ok = 0;
            raw = NULL;  /* stolen */
        }
        if (ok && cache_len > 2) {
            PyObject *sid = PyLong_FromLongLong(step_id);
            if (sid == NULL || PyList_SetItem(cache, 2, sid) < 0)
                ok = 0;
        }
    }
    Py_XDECREF(raw);
    Py_XDECREF(tokens);
    Py_XDECREF(contexts);
    Py_DECREF(ids);
    if (!ok) {
        Py_XDECREF(step);
        return NULL;
    }
    return step;
}

/* setup_decode(decode_py, StepRecord, empty prefill_at, empty links) */
static PyObject *setup_decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *fn, *cls, *none, *links;
    if (!PyArg_ParseTuple(args, "OO!OO:setup_decode", &fn, &PyType_Type, &cls, &none, &links))
        return NULL;
    Py_XSETREF(py_decode, Py_NewRef(fn));
    Py_XSETREF(record_type, Py_NewRef(cls));
    Py_XSETREF(no_prefill, Py_NewRef(none));
    Py_XSETREF(no_links, Py_NewRef(links));
    Py_RETURN_NONE;
}


/* ---- the frontend's ring read: shm_ring.RingReader.read of a ring whose positions and sizes make sense ----
 *
 * Returns the records written since the last read (bytes, oldest first) and publishes `consumed` and `tail`
 * as the Python reader does, or None, having touched nothing, when the positions or a record's size make no
 * sense: RingReader.read then reads the same ring and raises its RingError (it skips what was written). */

static PyObject *s_tail, *s_consumed;
static Py_ssize_t ring_consumed = -1;

static PyObject *ring_read(PyObject *Py_UNUSED(self), PyObject *reader) {
    if (ring_consumed < 0)
        Py_RETURN_NONE;
    PyObject *mm = PyObject_GetAttr(reader, s_mm);
    if (mm == NULL)
        return NULL;
    Py_buffer view;
    int got = PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE); /* fails on a closed mmap: never a dangling pointer */
    Py_DECREF(mm);
    if (got < 0)
        return NULL;
    PyObject *out = NULL, *o = NULL;
    unsigned long long cap, tail, consumed;
    o = PyObject_GetAttr(reader, s_cap);
    if (o == NULL || get_size(o, "cap", &cap) < 0)
        goto done;
    Py_SETREF(o, PyObject_GetAttr(reader, s_tail));
    if (o == NULL || get_size(o, "tail", &tail) < 0)
        goto done;
    Py_SETREF(o, PyObject_GetAttr(reader, s_consumed));
    if (o == NULL || get_size(o, "consumed", &consumed) < 0)
        goto done;
    Py_CLEAR(o);
    if (cap == 0 || cap % 4 || view.len < ring_data + (Py_ssize_t)cap) {
        PyErr_SetString(PyExc_ValueError, "step ring of another size than its reader says");
        goto done;
    }
    /* The list first: from the head's load to the last copy nothing runs Python code (no allocation the
     * cycle collector could run in, hence no finalizer that could write the ring in between). */
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    unsigned char *base = view.buf;
    const unsigned char *data_at = base + ring_data;
    /* The shared memory is untrusted: the writer's head and each record's size are read once, into locals,
     * and bounded before use; the bytes are copied once. (A size read twice, checked the first time and
     * used the second, would let a writer that changes it in between make the copy run past the ring.) */
    /* acquire: pairs with the writer's release store of head, so the records' bytes are there (shm_ring) */
    uint64_t head = __atomic_load_n((uint64_t *)(base + ring_head), __ATOMIC_ACQUIRE);
    if (head == tail)
        goto done;
    /* tail is the reader's own, but it started from the ring's word (RingReader): checked alike */
    if (head < tail || head - tail > cap || head % 4 || tail % 4)
        goto refuse;
    Py_ssize_t count = 0;
    for (unsigned long long t = tail; t < head; count++) {
        unsigned long long p = t % cap;  /* a multiple of 4, at most cap - 4: the size word is inside */
        uint32_t size;
        memcpy(&size, data_at + p, 4);
        unsigned long long step = 4 + (((unsigned long long)size + 3) & ~3ull);
        if (size > cap - 4 || step > head - t)  /* (the second bounds the first: head - tail <= cap) */
            goto refuse;
        PyObject *rec = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (rec == NULL || PyList_Append(out, rec) < 0) {
            Py_XDECREF(rec);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(rec);
        char *dst = PyBytes_AS_STRING(rec);  /* (the list holds it) */
        unsigned long long q = p + 4;
        if (q + size <= cap) {
            memcpy(dst, data_at + q, size);
        } else {  /* wraps around the end: q < cap, and size - (cap - q) < cap */
            size_t first = (size_t)(cap - q);
            memcpy(dst, data_at + q, first);
            memcpy(dst + first, data_at, size - first);
        }
        t += step;
    }
    /* the reader's own positions, then published: consumed, and tail last with a release store (after the
     * copies: from then on the writer may reuse the space) */
    o = PyLong_FromUnsignedLongLong(consumed + (unsigned long long)count);
    if (o == NULL || PyObject_SetAttr(reader, s_consumed, o) < 0)
        goto fail;
    Py_SETREF(o, PyLong_FromUnsignedLongLong(head));
    if (o == NULL || PyObject_SetAttr(reader, s_tail, o) < 0)
        goto fail;
    Py_CLEAR(o);
    __atomic_store_n((uint64_t *)(base + ring_consumed), (uint64_t)(consumed + (unsigned long long)count),
                     __ATOMIC_RELAXED);
    __atomic_store_n((uint64_t *)(base + ring_tail), (uint64_t)head, __ATOMIC_RELEASE);
    goto done;
refuse:  /* positions or a size that make no sense: nothing taken, nothing published (RingReader.read raises) */
    Py_SETREF(out, Py_NewRef(Py_None));
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(o);
    PyBuffer_Release(&view);
    return out;
}

/* setup_ring_read(consumed offset) */
static PyObject *setup_ring_read(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "n:setup_ring_read", &at))
        return NULL;
    if (at % 8 || at < 0) {
        PyErr_SetString(PyExc_ValueError, "_step_fast was built for another ring layout");
        return NULL;
    }
    ring_consumed = at;
    Py_RETURN_NONE;
}

/* setup(encode_py, version, header_size, ring_data, ring_head, ring_tail): the Python side's constants */
static PyObject *setup(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *fn;
    Py_ssize_t header_size;
    if (!PyArg_ParseTuple(args, "Oinnnn:setup", &fn, &wire_version, &header_size, &ring_data, &ring_head, &ring_tail))
        return NULL;
    if (header_size != HEADER_SIZE || ring_head % 8 || ring_tail % 8 || ring_data % 8) {
        PyErr_SetString(PyExc_ValueError, "_step_fast was built for another wire or ring layout");
        return NULL;
    }
    Py_XSETREF(py_encode, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(encode_py, version, header_size, ring_data, ring_head, ring_tail)"},
    {"encode", encode, METH_VARARGS, "encode(payload, cache=None, same_ids=False) -> bytes: step_wire.encode's record"},
    {"encode_into_rings", encode_into_rings, METH_VARARGS,
     "encode_into_rings(payload, cache, writers) -> int: the record copied into each RingWriter; rings that were full"},
    {"setup_decode", setup_decode, METH_VARARGS, "setup_decode(decode_py, StepRecord, no_prefill, no_links)"},
    {"setup_ring_read", setup_ring_read, METH_VARARGS, "setup_ring_read(consumed_offset)"},
    {"ring_read", ring_read, METH_O, "ring_read(reader) -> list of records, or None: RingReader.read decides"},
    {"decode", decode, METH_VARARGS, "decode(data, cache=None) -> StepRecord: step_wire.decode_py's record"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step_fast", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__step_fast(void) {
    if ((s_mm = PyUnicode_InternFromString("mm")) == NULL || (s_cap = PyUnicode_InternFromString("cap")) == NULL
        || (s_head = PyUnicode_InternFromString("head")) == NULL
        || (s_written = PyUnicode_InternFromString("written")) == NULL)
        return NULL;
    if ((s_tail = PyUnicode_InternFromString("tail")) == NULL
        || (s_consumed = PyUnicode_InternFromString("consumed")) == NULL)
        return NULL;
    for (int i = 0; i < N_SLOTS; i++)
        if ((slot_names[i] = PyUnicode_InternFromString(slot_strs[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
