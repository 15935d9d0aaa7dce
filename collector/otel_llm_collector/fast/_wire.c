/* One validating pass over an encoded ExportTraceServiceRequest, building what spans.extract reads.
 *
 * Why: the receivers parsed each request twice - the full upb classes to validate it (what refuses malformed
 * input), then otel_llm/otlp/view.py's stand-in types to read it (spans as bytes, attributes as a C-built
 * map). upb's Python API cannot do both in one parse, so this does: it walks the wire format once, checks
 * every field against tables that otel_llm/otlp/wire_schema.py derives from the installed descriptors at import
 * (nothing about the schema is typed here), and returns, per ResourceSpans / ScopeSpans / Span, the same
 * values the view gives.
 *
 * Validation follows upb (the oracle; tests/collector/test_wire_onepass.py checks verdicts against
 * ExportTraceServiceRequest.FromString on thousands of inputs):
 *   - wire types 6 and 7, truncated values, varints over 10 bytes, tags over 5 bytes or 32 bits,
 *     lengths over 5 bytes or past the end, field number 0 (outside groups) are refused;
 *   - a known field with another wire type than its declared one is an unknown field (skipped);
 *   - unknown fields are skipped, groups included (nested, each end matching its start; field number 0
 *     allowed inside a group, as upb allows it); an end group outside a group is refused;
 *   - proto3 `string` fields must be valid UTF-8 (bytes fields and unknown fields are not checked);
 *   - every submessage and group is one nesting level; the request is level 0 and `limit` (upb's 100) is
 *     the deepest level allowed. Recursion is bounded by that limit.
 *   - every occurrence of a field is checked (a repeated key, a second copy of a message field).
 * What is read follows the view's types: bytes/string fields keep their last occurrence, `kind` is an int32,
 * a span's attributes are key -> encoded AnyValue with the last occurrence of a key winning.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* field kinds (otel_llm/otlp/wire_schema.py's VARINT ... FIXED32, same order) and the wire type each expects */
enum { K_ABSENT = -1, K_VARINT = 0, K_FIXED64 = 1, K_BYTES = 2, K_STRING = 3, K_MESSAGE = 4, K_FIXED32 = 5 };
static const int WIRE_OF[] = {0, 1, 2, 2, 2, 5};

/* what extraction reads from a field (otel_llm/otlp/wire_schema.py's ROLES, same order, from 1); 0: nothing */
enum { R_NONE, R_RESOURCE_SPANS, R_RESOURCE, R_SCOPE_SPANS, R_RS_URL, R_SCOPE, R_SPANS, R_SS_URL, R_TRACE_ID,
       R_SPAN_ID, R_PARENT, R_KIND, R_START, R_END, R_ATTRIBUTES, R_STATUS, R_KEY, R_VALUE, R_CODE, R_COUNT };

typedef struct { int kind; int sub; int role; const char *name; } Field;
typedef struct { uint32_t max; Field *by_number; /* index: field number (0..max) */ } Msg;
typedef struct { PyObject *key; const char *s; Py_ssize_t n; uint64_t h; } Wanted;

typedef struct {
    int nmsgs, limit;
    Msg *msgs;
    char *names;  /* all field names, back to back (for error messages) */
    int sub[R_COUNT];  /* role -> the message type it holds (for message roles) */
    Wanted *table;  /* open addressing; NULL: every attribute key is wanted */
    size_t mask;
} Schema;

typedef struct {
    const Schema *s;
    const char *base;
    const char *err;  /* the reason; NULL while none */
    const char *where;  /* field name, may be NULL */
    Py_ssize_t at;  /* byte offset */
    PyObject *last_tid;  /* spans of one trace share one trace id object */
} Ctx;

static PyObject *EMPTY_STR;

static void *fail(Ctx *c, const char *p, const char *why, const char *where) {
    if (!c->err) { c->err = why; c->where = where; c->at = p - c->base; }
    return NULL;
}

/* a varint of at most maxlen bytes; NULL if truncated or longer (bits past 64 are dropped, as upb does) */
static inline const char *varint(const char *p, const char *end, uint64_t *out, int maxlen) {
    uint64_t v = 0;
    for (int i = 0; i < maxlen; i++) {
        if (p >= end) return NULL;
        uint8_t b = (uint8_t)*p++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) { *out = v; return p; }
    }
    return NULL;
}

static inline const char *read_tag(Ctx *c, const char *p, const char *end, uint32_t *tag) {
    uint64_t v;
    const char *q = varint(p, end, &v, 5);
    if (!q || v > 0xFFFFFFFFu) return fail(c, p, q || end - p >= 5 ? "tag too long" : "truncated tag", NULL);
    *tag = (uint32_t)v;
    return q;
}

/* strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF): what upb checks on proto3 strings */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        unsigned char b = s[i], b1;
        if (b < 0x80) { i++; continue; }
        if (b >= 0xC2 && b <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            if (i + 2 >= n) return 0;
            b1 = s[i + 1];
            if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F)) return 0;
            if ((b1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
        } else if (b >= 0xF0 && b <= 0xF4) {
            if (i + 3 >= n) return 0;
            b1 = s[i + 1];
            if ((b == 0xF0 && b1 < 0x90) || (b == 0xF4 && b1 > 0x8F)) return 0;
            if ((b1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static const char *skip_group(Ctx *c, const char *p, const char *end, uint32_t number, int level);

/* one value of wire type wt (not a start/end group); its payload for length-delimited ones */
static inline const char *read_value(Ctx *c, const char *p, const char *end, int wt, const char **data,
                                     Py_ssize_t *len, uint64_t *val, const char *where) {
    uint64_t v;
    const char *q;
    switch (wt) {
    case 0:
        q = varint(p, end, val, 10);
        return q ? q : fail(c, p, end - p >= 10 ? "varint too long" : "truncated varint", where);
    case 1:
        if (end - p < 8) return fail(c, p, "truncated fixed64", where);
        memcpy(val, p, 8);  /* little-endian machines only: fast/wire.py checks at import */
        return p + 8;
    case 5:
        if (end - p < 4) return fail(c, p, "truncated fixed32", where);
        return p + 4;
    case 2:
        q = varint(p, end, &v, 5);
        if (!q) return fail(c, p, end - p >= 5 ? "length too long" : "truncated length", where);
        if (v > (uint64_t)(end - q)) return fail(c, p, "length past the end of its message", where);
        *data = q;
        *len = (Py_ssize_t)v;
        return q + v;
    default:
        return fail(c, p, "invalid wire type", where);
    }
}

/* the rest of an unknown group at `level` (its start tag read): tags, values, nested groups to its end */
static const char *skip_group(Ctx *c, const char *p, const char *end, uint32_t number, int level) {
    if (level > c->s->limit) return fail(c, p, "nested too deep", NULL);
    for (;;) {
        uint32_t tag;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (p >= end) return fail(c, p, "unterminated group", NULL);
        const char *at = p;
        if (!(p = read_tag(c, p, end, &tag))) return NULL;
        int wt = tag & 7;
        if (wt == 4) return (tag >> 3) == number ? p : fail(c, at, "end group does not match its start", NULL);
        if (wt > 5) return fail(c, at, "invalid wire type", NULL);
        p = wt == 3 ? skip_group(c, p, end, tag >> 3, level + 1) : read_value(c, p, end, wt, &data, &len, &val, NULL);
        if (!p) return NULL;
    }
}

/* The next field of a message of type m at `level`: the field if it is known and has its declared wire type
 * (else *f = NULL: unknown, already skipped); strings checked here, submessages left to the caller (after
 * the depth check here). */
static inline const char *next_field(Ctx *c, const char *p, const char *end, const Msg *m, int level,
                                     const Field **f, const char **data, Py_ssize_t *len, uint64_t *val) {
    uint32_t tag;
    const char *start = p;
    if (!(p = read_tag(c, p, end, &tag))) return NULL;
    uint32_t number = tag >> 3;
    int wt = tag & 7;
    if (number == 0) return fail(c, start, "field number 0", NULL);
    const Field *known = number <= m->max ? &m->by_number[number] : NULL;
    if (known && (known->kind == K_ABSENT || WIRE_OF[known->kind] != wt)) known = NULL;
    *f = known;
    if (wt == 3) return skip_group(c, p, end, number, level + 1);
    if (wt == 4) return fail(c, start, "end group without a start", NULL);
    if (wt > 5) return fail(c, start, "invalid wire type", NULL);
    const char *where = known ? known->name : NULL;
    if (!(p = read_value(c, p, end, wt, data, len, val, where))) return NULL;
    if (known) {
        if (known->kind == K_STRING && !utf8_ok((const unsigned char *)*data, *len))
            return fail(c, *data, "invalid UTF-8", where);
        if (known->kind == K_MESSAGE && level + 1 > c->s->limit) return fail(c, *data, "nested too deep", where);
    }
    return p;
}

/* a whole message of type m at `level`, nothing kept */
static int validate(Ctx *c, const char *p, const char *end, int m, int level) {
    const Msg *msg = &c->s->msgs[m];
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(c, p, end, msg, level, &f, &data, &len, &val))) return -1;
        if (f && f->kind == K_MESSAGE && validate(c, data, data + len, f->sub, level + 1) < 0) return -1;
    }
    return 0;
}

static uint64_t hash_key(const char *s, Py_ssize_t n) {  /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* The str for an attribute key if it is wanted (new reference), NULL if not (or on error: check c->err /
 * PyErr_Occurred). Without a table every key is wanted. */
static PyObject *wanted_key(Ctx *c, const char *s, Py_ssize_t n) {
    const Schema *sc = c->s;
    if (!sc->table) return PyUnicode_DecodeUTF8(s, n, NULL);
    uint64_t h = hash_key(s, n);
    for (size_t i = h & sc->mask;; i = (i + 1) & sc->mask) {
        const Wanted *w = &sc->table[i];
        if (!w->key) return NULL;
        if (w->h == h && w->n == n && memcmp(w->s, s, n) == 0) { Py_INCREF(w->key); return w->key; }
    }
}

/* one span attribute (a KeyValue at `level`) validated; its key and encoded value (last occurrences). Returns
 * 0 when the KeyValue holds any other field (key_strindex, an unknown field, a key or value with another wire
 * type): the view reads it as a map entry and upb leaves such an entry out of the map (keeping it unknown), so
 * it is left out here too; 1 otherwise; -1 on error. */
static int read_kv(Ctx *c, const char *p, const char *end, int m, int level, const char **key, Py_ssize_t *klen,
                   const char **value, Py_ssize_t *vlen) {
    const Msg *msg = &c->s->msgs[m];
    *key = *value = p;
    *klen = *vlen = 0;
    int clean = 1;
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(c, p, end, msg, level, &f, &data, &len, &val))) return -1;
        if (!f) { clean = 0; continue; }
        if (f->kind == K_MESSAGE && validate(c, data, data + len, f->sub, level + 1) < 0) return -1;
        if (f->role == R_KEY) { *key = data; *klen = len; }
        else if (f->role == R_VALUE) { *value = data; *vlen = len; }
        else clean = 0;
    }
    return clean;
}

/* whether encoded (validated) Status bytes say code == ERROR (2), the last code read as an int32 */
static int status_error(Ctx *c, const char *p, const char *end, int level) {
    const Msg *msg = &c->s->msgs[c->s->sub[R_STATUS]];
    int32_t code = 0;
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(c, p, end, msg, level, &f, &data, &len, &val))) return -1;
        if (f && f->role == R_CODE) code = (int32_t)(uint32_t)val;
    }
    return code == 2;
}

static PyObject *bytes_of(const char *p, Py_ssize_t n) { return PyBytes_FromStringAndSize(p, n); }

/* one span at level 3: (encoded, trace_id, span_id, parent_span_id, kind, start, end, error, attrs or None) */
static PyObject *read_span(Ctx *c, const char *p, const char *end) {
    const int level = 3;
    const Msg *msg = &c->s->msgs[c->s->sub[R_SPANS]];
    const char *start = p, *tid = p, *sid = p, *parent = p, *status = p;
    Py_ssize_t ntid = 0, nsid = 0, nparent = 0, nstatus = 0;
    uint64_t kind = 0, t0 = 0, t1 = 0;
    PyObject *attrs = NULL, *out = NULL;
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(c, p, end, msg, level, &f, &data, &len, &val))) goto error;
        if (!f) continue;
        switch (f->role) {
        case R_TRACE_ID: tid = data; ntid = len; break;
        case R_SPAN_ID: sid = data; nsid = len; break;
        case R_PARENT: parent = data; nparent = len; break;
        case R_KIND: kind = val; break;
        case R_START: t0 = val; break;
        case R_END: t1 = val; break;
        case R_STATUS:
            if (validate(c, data, data + len, f->sub, level + 1) < 0) goto error;
            status = data; nstatus = len;
            break;
        case R_ATTRIBUTES: {
            const char *key, *value;
            Py_ssize_t klen, vlen;
            int clean = read_kv(c, data, data + len, f->sub, level + 1, &key, &klen, &value, &vlen);
            if (clean < 0) goto error;
            if (!clean) break;
            PyObject *k = wanted_key(c, key, klen);
            if (!k) {
                if (PyErr_Occurred()) goto error;
                break;
            }
            PyObject *v = bytes_of(value, vlen);
            if (!attrs) attrs = PyDict_New();
            int rc = (v && attrs) ? PyDict_SetItem(attrs, k, v) : -1;
            Py_DECREF(k);
            Py_XDECREF(v);
            if (rc < 0) goto error;
            break;
        }
        default:
            if (f->kind == K_MESSAGE && validate(c, data, data + len, f->sub, level + 1) < 0) goto error;
        }
    }
    int error = nstatus ? status_error(c, status, status + nstatus, level + 1) : 0;
    if (error < 0) goto error;
    PyObject *trace;
    PyObject *last = c->last_tid;
    if (last && PyBytes_GET_SIZE(last) == ntid && memcmp(PyBytes_AS_STRING(last), tid, ntid) == 0) {
        trace = c->last_tid;
        Py_INCREF(trace);
    } else {
        if (!(trace = bytes_of(tid, ntid))) goto error;
        Py_XSETREF(c->last_tid, trace);
        Py_INCREF(trace);
    }
    if (!attrs) { attrs = Py_None; Py_INCREF(attrs); }
    if (!(out = PyTuple_New(9))) { Py_DECREF(trace); goto error; }
    PyObject *bool_error = error ? Py_True : Py_False;
    Py_INCREF(bool_error);
    /* the tuple owns each item as it is set: a NULL item (no memory) is released with the tuple */
    PyTuple_SET_ITEM(out, 0, bytes_of(start, end - start));
    PyTuple_SET_ITEM(out, 1, trace);
    PyTuple_SET_ITEM(out, 2, bytes_of(sid, nsid));
    PyTuple_SET_ITEM(out, 3, bytes_of(parent, nparent));
    PyTuple_SET_ITEM(out, 4, PyLong_FromLong((int32_t)(uint32_t)kind));
    PyTuple_SET_ITEM(out, 5, PyLong_FromUnsignedLongLong(t0));
    PyTuple_SET_ITEM(out, 6, PyLong_FromUnsignedLongLong(t1));
    PyTuple_SET_ITEM(out, 7, bool_error);
    PyTuple_SET_ITEM(out, 8, attrs);
    for (int i = 0; i < 9; i++)
        if (!PyTuple_GET_ITEM(out, i)) { Py_DECREF(out); return NULL; }
    return out;
error:
    Py_XDECREF(attrs);
    return NULL;
}

static PyObject *str_of(const char *p, Py_ssize_t n) {
    if (!n) { Py_INCREF(EMPTY_STR); return EMPTY_STR; }
    return PyUnicode_DecodeUTF8(p, n, NULL);
}

/* a ScopeSpans (level 2) or ResourceSpans (level 1): (encoded scope/resource, schema_url, [children]) */
static PyObject *read_group(Ctx *c, const char *p, const char *end, int level) {
    const int scope = level == 2;
    const Msg *msg = &c->s->msgs[c->s->sub[scope ? R_SCOPE_SPANS : R_RESOURCE_SPANS]];
    const int r_head = scope ? R_SCOPE : R_RESOURCE, r_url = scope ? R_SS_URL : R_RS_URL,
              r_child = scope ? R_SPANS : R_SCOPE_SPANS;
    const char *head = p, *url = p;
    Py_ssize_t nhead = 0, nurl = 0;
    PyObject *children = PyList_New(0);
    if (!children) return NULL;
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(c, p, end, msg, level, &f, &data, &len, &val))) goto error;
        if (!f) continue;
        if (f->role == r_child) {
            PyObject *child = scope ? read_span(c, data, data + len) : read_group(c, data, data + len, level + 1);
            if (!child) goto error;
            int rc = PyList_Append(children, child);
            Py_DECREF(child);
            if (rc < 0) goto error;
            continue;
        }
        if (f->kind == K_MESSAGE && validate(c, data, data + len, f->sub, level + 1) < 0) goto error;
        if (f->role == r_head) { head = data; nhead = len; }
        else if (f->role == r_url) { url = data; nurl = len; }
    }
    return Py_BuildValue("(y#NN)", head, nhead, str_of(url, nurl), children);
error:
    Py_DECREF(children);
    return NULL;
}

static void schema_free(PyObject *capsule) {
    Schema *s = PyCapsule_GetPointer(capsule, "otel_llm_collector.fast._wire.Schema");
    if (!s) return;
    if (s->msgs) for (int i = 0; i < s->nmsgs; i++) PyMem_Free(s->msgs[i].by_number);
    PyMem_Free(s->msgs);
    PyMem_Free(s->names);
    if (s->table) for (size_t i = 0; i <= s->mask; i++) Py_XDECREF(s->table[i].key);
    PyMem_Free(s->table);
    PyMem_Free(s);
}

/* compile(messages, roles, wanted, limit): messages = [[(number, kind, sub, role, name), ...], ...] with the
 * request first; wanted: attribute keys to keep (None: all). Returns the capsule read() takes. */
static PyObject *wire_compile(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *messages, *wanted, *capsule = NULL;
    int limit;
    if (!PyArg_ParseTuple(args, "O!Oi", &PyList_Type, &messages, &wanted, &limit)) return NULL;
    Schema *s = PyMem_Calloc(1, sizeof(Schema));
    if (!s) return PyErr_NoMemory();
    if (!(capsule = PyCapsule_New(s, "otel_llm_collector.fast._wire.Schema", schema_free))) {
        PyMem_Free(s);
        return NULL;
    }
    s->limit = limit;
    s->nmsgs = (int)PyList_GET_SIZE(messages);
    size_t names = 0;
    if (!(s->msgs = PyMem_Calloc(s->nmsgs ? s->nmsgs : 1, sizeof(Msg)))) goto nomem;
    for (int m = 0; m < s->nmsgs; m++) {  /* sizes first: the names live in one block */
        PyObject *fields = PyList_GET_ITEM(messages, m);
        if (!PyList_Check(fields)) goto bad;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fields); i++) {
            unsigned long number;
            int kind, sub, role;
            const char *name;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, i), "kiiis", &number, &kind, &sub, &role, &name)) goto fail;
            if (number == 0 || number > 536870911UL || kind < 0 || kind > K_FIXED32 || role < 0 || role >= R_COUNT ||
                (kind == K_MESSAGE && (sub < 0 || sub >= s->nmsgs)))
                goto bad;
            if (number > s->msgs[m].max) s->msgs[m].max = (uint32_t)number;
            names += strlen(name) + 1;
        }
        if (s->msgs[m].max > 4096) goto bad;  /* a direct table: OTLP's numbers are small */
    }
    if (!(s->names = PyMem_Malloc(names ? names : 1))) goto nomem;
    char *next = s->names;
    for (int m = 0; m < s->nmsgs; m++) {
        PyObject *fields = PyList_GET_ITEM(messages, m);
        Msg *msg = &s->msgs[m];
        if (!(msg->by_number = PyMem_Malloc((msg->max + 1) * sizeof(Field)))) goto nomem;
        for (uint32_t n = 0; n <= msg->max; n++) msg->by_number[n] = (Field){K_ABSENT, -1, R_NONE, NULL};
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fields); i++) {
            unsigned long number;
            int kind, sub, role;
            const char *name;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, i), "kiiis", &number, &kind, &sub, &role, &name)) goto fail;
            strcpy(next, name);
            msg->by_number[number] = (Field){kind, sub, role, next};
            next += strlen(name) + 1;
            if (role != R_NONE && kind == K_MESSAGE) s->sub[role] = sub;
        }
    }
    /* every role is present with the kind assumed here: checked by wire_schema.tables */
    if (wanted != Py_None) {
        PyObject *seq = PySequence_Fast(wanted, "wanted: a sequence of str or None");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        size_t size = 8;
        while (size < (size_t)n * 2 + 2) size <<= 1;
        if (!(s->table = PyMem_Calloc(size, sizeof(Wanted)))) { Py_DECREF(seq); goto nomem; }
        s->mask = size - 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
            Py_ssize_t len;
            const char *utf8 = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &len) : NULL;
            if (!utf8) { Py_DECREF(seq); if (!PyErr_Occurred()) goto bad; goto fail; }
            uint64_t h = hash_key(utf8, len);
            size_t j = h & s->mask;
            while (s->table[j].key && !(s->table[j].n == len && memcmp(s->table[j].s, utf8, len) == 0))
                j = (j + 1) & s->mask;
            if (s->table[j].key) continue;  /* a duplicate */
            Py_INCREF(key);
            s->table[j] = (Wanted){key, utf8, len, h};
        }
        Py_DECREF(seq);
    }
    return capsule;
nomem:
    PyErr_NoMemory();
    goto fail;
bad:
    PyErr_SetString(PyExc_ValueError, "compile: malformed schema tables");
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* read(schema, raw): [(encoded Resource, schema_url, [(encoded scope, schema_url, [span, ...]), ...]), ...];
 * ValueError with the reason when raw is not a valid request. */
static PyObject *wire_read(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *capsule, *out = NULL;
    Py_buffer raw;
    if (!PyArg_ParseTuple(args, "Oy*", &capsule, &raw)) return NULL;
    Schema *s = PyCapsule_GetPointer(capsule, "otel_llm_collector.fast._wire.Schema");
    if (!s) goto done;
    Ctx c = {s, raw.buf, NULL, NULL, 0, NULL};
    const char *p = raw.buf, *end = p + raw.len;
    const Msg *msg = &s->msgs[0];
    if (!(out = PyList_New(0))) goto done;
    while (p < end) {
        const Field *f;
        const char *data;
        Py_ssize_t len;
        uint64_t val;
        if (!(p = next_field(&c, p, end, msg, 0, &f, &data, &len, &val))) goto error;
        if (!f) continue;
        if (f->role == R_RESOURCE_SPANS) {
            PyObject *rs = read_group(&c, data, data + len, 1);
            if (!rs) goto error;
            int rc = PyList_Append(out, rs);
            Py_DECREF(rs);
            if (rc < 0) goto error;
        } else if (f->kind == K_MESSAGE && validate(&c, data, data + len, f->sub, 1) < 0) {
            goto error;
        }
    }
    Py_XDECREF(c.last_tid);
    goto done;
error:
    Py_XDECREF(c.last_tid);
    Py_CLEAR(out);
    if (c.err && !PyErr_Occurred()) {
        if (c.where) PyErr_Format(PyExc_ValueError, "%s in %s at byte %zd", c.err, c.where, c.at);
        else PyErr_Format(PyExc_ValueError, "%s at byte %zd", c.err, c.at);
    }
done:
    PyBuffer_Release(&raw);
    return out;
}

static PyMethodDef methods[] = {
    {"compile", wire_compile, METH_VARARGS, "compile(messages, wanted, limit) -> schema capsule"},
    {"read", wire_read, METH_VARARGS, "read(schema, raw) -> resource spans; ValueError(reason) when malformed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", "One validating pass over OTLP trace requests.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__wire(void) {
    if (!EMPTY_STR && !(EMPTY_STR = PyUnicode_FromStringAndSize("", 0))) return NULL;
    return PyModule_Create(&module);
}
