/* Optional C twin of bounded_marshal.check: the walk over marshal bytes another process wrote, checking every
 * count against the bytes left before marshal may allocate by it; and loads, the walk and marshal's read of
 * the same bytes in one call (no copy of a record's body).
 *
 * The Python walker (bounded_marshal.check_py) is the reference: this file takes and refuses exactly what it
 * does, with the same ValueError messages (tests/agent/test_bounded_marshal.py compares both on every record
 * kind, truncations, flipped bytes and random bytes). Every byte is untrusted: each is read once, after a check
 * that it lies before the end; every count is checked against the bytes left, in 64-bit arithmetic, before
 * anything moves by it; the walk keeps a fixed stack of MAX_DEPTH levels, no recursion and no allocation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <stdint.h>

#define MAX_DEPTH 64 /* bounded_marshal.MAX_DEPTH: levels of open containers (the walk's stack) */
#define DICT_OPEN (-1) /* a dict's level: values until its NULL key */

/* what follows a value's code (marshal.c, format 4; the 0x80 bit, a reference flag, is masked off first):
 * FIXED bytes; a length of SIZED bytes, then that many bytes; a count of COUNTED bytes, then that many items;
 * a long's digit count (4 bytes, signed), then two bytes a digit; a dict's items until a NULL */
enum { NONE = 0, FIXED, SIZED, COUNTED, LONG, DICT };

typedef struct {
    unsigned char kind, width;
} code_t;

static code_t codes[128];

static void set_codes(const char *which, unsigned char kind, unsigned char width) {
    for (; *which; which++)
        codes[(unsigned char)*which] = (code_t){kind, width};
}

static int cut_short(void) {
    PyErr_SetString(PyExc_ValueError, "marshal data cut short");
    return -1;
}

/* 0: the bytes pass (every count fits the bytes left); -1: ValueError set */
static int walk(const unsigned char *raw, Py_ssize_t end) {
    int64_t open_[MAX_DEPTH]; /* values still to read at each open level (DICT_OPEN: a dict's) */
    int depth = 1;
    Py_ssize_t i = 0;
    open_[0] = 1;
    while (depth > 0) {
        int64_t left = open_[depth - 1];
        if (left == 0) {
            depth--;
            continue;
        }
        if (i >= end)
            return cut_short();
        unsigned char code = raw[i] & 0x7F;
        i++;
        if (left > 0)
            open_[depth - 1] = left - 1;
        else if (code == '0') { /* a dict's end */
            depth--;
            continue;
        }
        code_t c = codes[code];
        if (c.kind == FIXED) {
            if (c.width > end - i)
                return cut_short();
            i += c.width;
            continue;
        }
        if (c.kind == NONE) {
            PyObject *ch = PyUnicode_FromOrdinal(code);
            if (ch != NULL) {
                PyErr_Format(PyExc_ValueError, "marshal data of type %R", ch);
                Py_DECREF(ch);
            }
            return -1;
        }
        int64_t count = DICT_OPEN; /* a dict's level, or the count read below */
        if (c.kind != DICT) {
            if (c.width > end - i)
                return cut_short();
            if (c.width == 1) {
                count = raw[i];
            } else { /* four bytes, little-endian, signed */
                uint32_t u = (uint32_t)raw[i] | (uint32_t)raw[i + 1] << 8 | (uint32_t)raw[i + 2] << 16
                    | (uint32_t)raw[i + 3] << 24;
                count = u >= 0x80000000u ? (int64_t)u - ((int64_t)1 << 32) : (int64_t)u;
            }
            i += c.width;
            if (c.kind == LONG)
                count = (count < 0 ? -count : count) * 2; /* 15-bit digits, two bytes each */
            if (count < 0 || count > (int64_t)(end - i)) {
                PyErr_Format(PyExc_ValueError, "marshal data claims %lld items or bytes where %zd are left",
                             (long long)count, end - i);
                return -1;
            }
            if (c.kind != COUNTED) { /* a string's or a long's bytes */
                i += (Py_ssize_t)count;
                continue;
            }
        }
        if (depth >= MAX_DEPTH) {
            PyErr_Format(PyExc_ValueError, "marshal data nested deeper than %d", MAX_DEPTH);
            return -1;
        }
        open_[depth++] = count;
    }
    return 0;
}

static PyObject *check(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int rc = walk((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* loads(data, start=0): the value marshal reads from data[start:], once walk passed those bytes */
static PyObject *loads(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "loads(data, start=0) takes one or two arguments");
        return NULL;
    }
    Py_ssize_t start = 0;
    if (nargs == 2) {
        start = PyLong_AsSsize_t(args[1]);
        if (start == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    if (start < 0 || start > view.len) {
        PyErr_Format(PyExc_ValueError, "start %zd outside %zd bytes", start, view.len);
    } else {
        const char *body = (const char *)view.buf + start;
        Py_ssize_t size = view.len - start;
        if (walk((const unsigned char *)body, size) == 0)
            out = PyMarshal_ReadObjectFromString(body, size);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"check", check, METH_O, "check(data): None, or ValueError where a count passes the bytes left."},
    {"loads", (PyCFunction)(void (*)(void))loads, METH_FASTCALL,
     "loads(data, start=0): marshal's value in data[start:], once check passed those bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bounded_fast", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__bounded_fast(void) {
    set_codes("0NFT", FIXED, 0);
    set_codes("ir", FIXED, 4);
    set_codes("g", FIXED, 8);
    set_codes("stuaA", SIZED, 4);
    set_codes("zZ", SIZED, 1);
    set_codes("([<>", COUNTED, 4);
    set_codes(")", COUNTED, 1);
    set_codes("l", LONG, 4);
    set_codes("{", DICT, 0);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
