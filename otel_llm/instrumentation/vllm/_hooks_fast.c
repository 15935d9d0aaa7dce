/* The scheduler hooks' steady step in C: vLLM's Scheduler.schedule and Scheduler.update_from_output,
 * each replaced on the class by a HookMethod that times the call and keeps (schedule) or sends
 * (update_from_output) the step exactly as step_hooks.StepHooks.scheduled / .updated would.
 *
 * Why: in Python most of the two hooks' cost to the EngineCore is Python frames (the wrappers, the hook
 * bodies, their attribute reads), paid every step on vLLM's critical path, the EngineCore's loop
 * (benchmarks/engine_step_hooks.py, modes hooks and hooks_pymethods). This takes the
 * step that dominates a serving engine (a decode or chunked-prefill batch of already-running requests, no
 * speculative drafts, no LoRA adapters, no new or resumed request) and hands every other step to the
 * Python methods, the reference: on any doubt (an attribute missing, a type it does not expect) it has
 * changed nothing yet and calls them, so they keep, count and report what they would have. The state
 * lives on the StepHooks object (pending, last_end, counter, ...), shared by both paths: a step kept by
 * one may be sent by the other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#if PY_VERSION_HEX >= 0x030D0000
#define LOOKUP_ATTR PyObject_GetOptionalAttr
#else
#define LOOKUP_ATTR _PyObject_LookupAttr
#endif

enum { SCHEDULE = 0, UPDATE = 1 };
/* step_hooks.Pending's fields, in order (and P_SIZE their number); SHARES_SIZE: step_wire.Shares's.
 * Checked against the Python declarations by tests/vllm/test_c_layout.py */
enum { P_START, P_LEFT, P_IDLE_S, P_RUNNING, P_WAITING, P_PREEMPTED, P_KV_CACHE_USAGE, P_SHARES, P_QUEUE_BLOCKED,
       P_LORAS, P_SIZE };
#define SHARES_SIZE 7

/* set once by setup(): step_hooks' helpers and constants */
static PyObject *queue_blocked;   /* step_hooks._queue_blocked */
static PyObject *tokens_of;       /* StepHooks._tokens */
static PyObject *blocked_none;    /* timeline.BLOCKED_NONE */
static PyObject *no_share;        /* step_hooks._NONE */
static PyObject *model_attr;      /* model_timing.MODEL_TIME_ATTR */
static PyObject *worker_attr;     /* worker_facts.WORKER_FACTS_ATTR */

#define NAMES(X) \
    X(sink) X(clock) X(_active) X(prompt_len) X(recompute) X(lora_on) X(lora_config) X(preempted_ids) \
    X(kv_cache_manager) X(usage) X(running) X(waiting) X(pending) X(model) X(last_end) X(max_active) \
    X(scheduled_cached_reqs) X(req_ids) X(num_computed_tokens) X(num_output_tokens) X(resumed_req_ids) \
    X(scheduled_new_reqs) X(total_num_scheduled_tokens) X(num_scheduled_tokens) X(scheduled) X(updated) \
    X(schedule) X(update_from_output) X(failed) X(spec_on) X(scheduled_spec_decode_tokens) X(timer) \
    X(facts) X(timestamp) X(prefix) X(counter) X(__name__) X(__qualname__) X(__module__) X(__doc__)
#define DECLARE(n) static PyObject *s_##n;
NAMES(DECLARE)
static PyObject *where_schedule, *where_update;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *original;  /* the function on the class before us (__wrapped__) */
    PyObject *hooks;     /* the StepHooks */
    PyObject *table;     /* its WrapTable: _active */
} HookMethod;

/* -- small helpers ----------------------------------------------------------------------------------- */

static int truth_of(PyObject *obj, PyObject *name) {  /* bool(obj.name): 1, 0, -1 with an exception */
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int is_on(HookMethod *self) {  /* the table active and the hooks armed: 1, else 0 (never an error) */
    int on = truth_of(self->table, s__active);
    if (on > 0) {
        PyObject *sink = PyObject_GetAttr(self->hooks, s_sink);
        on = sink != NULL && sink != Py_None;
        Py_XDECREF(sink);
    }
    if (on < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        on = 0;
    }
    return on;
}

static void report(HookMethod *self, PyObject *where) {
    /* an error of the C path after it changed state: StepHooks.failed counts it, as the Python path would */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallMethodObjArgs(self->hooks, s_failed, where, value ? value : Py_None, NULL);
    Py_XDECREF(r);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();  /* nothing reaches the engine */
}

static PyObject *whole_python(HookMethod *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    /* the StepHooks method as wrapt would call it: (bound original, instance, args, kwargs) */
    PyObject *bound = NULL, *rest = NULL, *kwargs = NULL, *result = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    bound = PyMethod_New(self->original, args[0]);
    rest = PyTuple_New(nargs - 1);
    kwargs = PyDict_New();
    if (bound == NULL || rest == NULL || kwargs == NULL) goto done;
    for (Py_ssize_t i = 1; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(rest, i - 1, args[i]);
    }
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) goto done;
    result = PyObject_CallMethodObjArgs(self->hooks, name, bound, args[0], rest, kwargs, NULL);
done:
    Py_XDECREF(bound);
    Py_XDECREF(rest);
    Py_XDECREF(kwargs);
    return result;
}

/* -- schedule -------------------------------------------------------------------------------------------- */

/* 1: the step kept in hooks.pending; 0: not a step this path takes (nothing changed, no exception set);
 * -1: an error after state changed (exception set) */
static int keep_step(PyObject *hooks, PyObject *sched, PyObject *out, PyObject *start, PyObject *left) {
    int rc = 0;
    PyObject *o = NULL, *cached = NULL, *ids = NULL, *computed = NULL, *outputs = NULL, *tokens = NULL,
             *no_output = NULL, *preempted = NULL, *kv = NULL, *blocked = NULL, *pending = NULL,
             *last_end = NULL, *idle = NULL, *shares = NULL, *entry = NULL, *key = NULL, *running_o = NULL,
             *waiting_o = NULL, *preempted_o = NULL, *usage = NULL;
    Py_ssize_t n, running, waiting, n_preempted = 0, total;
    int t;

    /* the readers are picked at the first step, by the Python path */
    if ((o = PyObject_GetAttr(hooks, s_prompt_len)) == NULL || o == Py_None) goto bail;
    Py_CLEAR(o);
    if ((cached = PyObject_GetAttr(out, s_scheduled_cached_reqs)) == NULL) goto bail;
    if ((ids = PyObject_GetAttr(cached, s_req_ids)) == NULL || !PyList_CheckExact(ids)) goto bail;
    if ((computed = PyObject_GetAttr(cached, s_num_computed_tokens)) == NULL || !PyList_CheckExact(computed)) goto bail;
    if ((outputs = PyObject_GetAttr(cached, s_num_output_tokens)) == NULL || !PyList_CheckExact(outputs)) goto bail;
    n = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(computed) != n || PyList_GET_SIZE(outputs) != n) goto bail;
    /* no share with a prompt entry: nothing resumed, recomputing or new */
    if ((t = truth_of(cached, s_resumed_req_ids)) != 0) goto bail;
    if ((o = PyObject_GetAttr(hooks, s_recompute)) == NULL || !PyDict_CheckExact(o) || PyDict_GET_SIZE(o)) goto bail;
    Py_CLEAR(o);
    if ((t = truth_of(out, s_scheduled_new_reqs)) != 0) goto bail;
    /* an engine serving LoRA adapters: the Python path reads them */
    if ((t = truth_of(hooks, s_lora_on)) != 0) {
        if (t < 0) goto bail;
        if ((o = PyObject_GetAttr(sched, s_lora_config)) == NULL || o != Py_None) goto bail;
        Py_CLEAR(o);
    }
    if ((o = PyObject_GetAttr(out, s_total_num_scheduled_tokens)) == NULL || !PyLong_CheckExact(o)) goto bail;
    total = PyLong_AsSsize_t(o);
    Py_CLEAR(o);
    if (total == -1 && PyErr_Occurred()) goto bail;
    if (total == n) {
        tokens = Py_None;  /* one token each: a plain decode batch */
        Py_INCREF(tokens);
    } else {
        if ((o = PyObject_GetAttr(out, s_num_scheduled_tokens)) == NULL) goto bail;
        if ((tokens = PyObject_CallFunctionObjArgs(tokens_of, o, ids, NULL)) == NULL) goto bail;
        Py_CLEAR(o);
    }
    /* shares with no output yet (a prefill chunk): their indices, else the shared empty tuple */
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((t = PyObject_IsTrue(PyList_GET_ITEM(outputs, i))) < 0) goto bail;
        if (!t) {
            if (no_output == NULL && (no_output = PyList_New(0)) == NULL) goto bail;
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(no_output, at) < 0) {
                Py_XDECREF(at);
                goto bail;
            }
            Py_DECREF(at);
        }
    }
    if (no_output == NULL) {
        no_output = no_share;
        Py_INCREF(no_output);
    }
    if ((o = PyObject_GetAttr(hooks, s_preempted_ids)) == NULL) goto bail;
    if ((preempted = PyObject_CallOneArg(o, out)) == NULL) goto bail;
    Py_CLEAR(o);
    if ((t = PyObject_IsTrue(preempted)) < 0) goto bail;
    if (t && (n_preempted = PyObject_Size(preempted)) < 0) goto bail;
    if ((o = PyObject_GetAttr(sched, s_kv_cache_manager)) == NULL) goto bail;
    if ((usage = PyObject_GetAttr(o, s_usage)) == NULL) goto bail;
    Py_CLEAR(o);
    if ((kv = PyNumber_Float(usage)) == NULL) goto bail;
    if ((o = PyObject_GetAttr(sched, s_running)) == NULL || (running = PyObject_Size(o)) < 0) goto bail;
    Py_CLEAR(o);
    if ((o = PyObject_GetAttr(sched, s_waiting)) == NULL || (waiting = PyObject_Size(o)) < 0) goto bail;
    Py_CLEAR(o);
    if ((running_o = PyLong_FromSsize_t(running)) == NULL || (waiting_o = PyLong_FromSsize_t(waiting)) == NULL
        || (preempted_o = PyLong_FromSsize_t(n_preempted)) == NULL) goto bail;
    if (waiting) {  /* why they wait: read right after schedule() ran (step_hooks._queue_blocked) */
        if ((o = PyObject_GetAttr(hooks, s_max_active)) == NULL) goto bail;
        blocked = PyObject_CallFunctionObjArgs(queue_blocked, sched, out, running_o, waiting_o, preempted_o, o, NULL);
        if (blocked == NULL) goto bail;
        Py_CLEAR(o);
    } else {
        blocked = blocked_none;
        Py_INCREF(blocked);
    }
    if ((pending = PyObject_GetAttr(hooks, s_pending)) == NULL || !PyDict_CheckExact(pending)) goto bail;
    if ((last_end = PyObject_GetAttr(hooks, s_last_end)) == NULL) goto bail;
    if ((key = PyLong_FromVoidPtr(out)) == NULL) goto bail;  /* id(out) */

    /* from here on state changes: errors are reported, not handed to the Python path */
    rc = -1;
    if (PyDict_GET_SIZE(pending) > 64) {  /* update_from_output never came (engine error): don't grow */
        PyDict_Clear(pending);
        if ((o = PyObject_GetAttr(hooks, s_model)) == NULL) goto done;
        if (PyDict_Check(o)) PyDict_Clear(o);
        Py_CLEAR(o);
    }
    /* idle only when nothing was in flight: under the batch queue a batch runs meanwhile */
    if (last_end == Py_None) {
        idle = Py_None;
        Py_INCREF(idle);
    } else if (PyDict_GET_SIZE(pending)) {
        idle = PyFloat_FromDouble(0.0);
    } else {
        idle = PyNumber_Subtract(start, last_end);
    }
    if (idle == NULL) goto done;
    shares = PyTuple_Pack(SHARES_SIZE, ids, tokens, computed, no_output, no_share, no_share, no_share);
    if (shares == NULL) goto done;
    entry = PyTuple_Pack(P_SIZE, start, left, idle, running_o, waiting_o, preempted_o, kv, shares, blocked, Py_None);
    if (entry == NULL || PyDict_SetItem(pending, key, entry) < 0) goto done;
    rc = 1;
    goto done;
bail:
    PyErr_Clear();
    rc = 0;
done:
    Py_XDECREF(o); Py_XDECREF(cached); Py_XDECREF(ids); Py_XDECREF(computed); Py_XDECREF(outputs);
    Py_XDECREF(tokens); Py_XDECREF(no_output); Py_XDECREF(preempted); Py_XDECREF(kv); Py_XDECREF(blocked);
    Py_XDECREF(pending); Py_XDECREF(last_end); Py_XDECREF(idle); Py_XDECREF(shares); Py_XDECREF(entry);
    Py_XDECREF(key); Py_XDECREF(running_o); Py_XDECREF(waiting_o); Py_XDECREF(preempted_o); Py_XDECREF(usage);
    return rc;
}

static PyObject *schedule(HookMethod *self, PyObject *const *args, size_t nargs) {
    PyObject *clock = NULL, *start = NULL, *left = NULL, *out;
    if ((clock = PyObject_GetAttr(self->hooks, s_clock)) == NULL || (start = PyObject_CallNoArgs(clock)) == NULL) {
        PyErr_Clear();  /* no clock, no record: the call itself goes on */
        Py_XDECREF(clock);
        return PyObject_Vectorcall(self->original, args, nargs, NULL);
    }
    out = PyObject_Vectorcall(self->original, args, nargs, NULL);
    if (out == NULL) goto done;  /* vLLM's own exception: its own to handle */
    if ((left = PyObject_CallNoArgs(clock)) == NULL) {
        PyErr_Clear();
        goto done;
    }
    int rc = keep_step(self->hooks, args[0], out, start, left);
    if (rc < 0) {
        report(self, where_schedule);
    } else if (rc == 0) {
        PyObject *r = PyObject_CallMethodObjArgs(self->hooks, s_scheduled, args[0], out, start, left, NULL);
        if (r == NULL) PyErr_Clear();  /* it catches its own: this is only for safety */
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(clock);
    Py_XDECREF(start);
    Py_XDECREF(left);
    return out;
}

/* -- update_from_output ------------------------------------------------------------------------------------ */

/* 1: the step's record sent; 0: not a step this path takes (nothing changed, no exception set);
 * -1: an error after state changed (exception set) */
static int send_step(PyObject *hooks, PyObject *sched_out, PyObject *model_out, PyObject *result,
                     PyObject *entered, PyObject *left) {
    int rc = 0, t, model_from_dict = 0;
    PyObject *o = NULL, *sink = NULL, *pending = NULL, *key = NULL, *model = NULL, *models = NULL,
             *facts = NULL, *end = NULL, *prefix = NULL, *counter = NULL, *count = NULL, *step_id = NULL,
             *payload = NULL, *sent = NULL, *times[3] = {NULL, NULL, NULL};
    PyObject *p;  /* the pending entry: borrowed from the dict until it is deleted */
    double start_d, scheduled_d, entered_d, end_d;

    if (!PyFloat_CheckExact(entered) || !PyFloat_CheckExact(left)) goto bail;
    if ((sink = PyObject_GetAttr(hooks, s_sink)) == NULL || sink == Py_None) goto bail;
    if ((pending = PyObject_GetAttr(hooks, s_pending)) == NULL || !PyDict_CheckExact(pending)) goto bail;
    if ((key = PyLong_FromVoidPtr(sched_out)) == NULL) goto bail;  /* id(scheduler_output) */
    p = PyDict_GetItemWithError(pending, key);
    if (p == NULL || !PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != P_SIZE) goto bail;
    Py_INCREF(p);  /* held while we look (another thread could clear the dict) */
    o = p;
    PyObject *shares = PyTuple_GET_ITEM(p, P_SHARES);
    if (!PyTuple_CheckExact(shares) || PyTuple_GET_SIZE(shares) != SHARES_SIZE) goto bail;
    if ((t = PyObject_IsTrue(PyTuple_GET_ITEM(shares, 0))) != 1) goto bail;  /* a step with requests */
    if (PyTuple_GET_ITEM(p, P_LORAS) != Py_None) goto bail;
    if (!PyFloat_CheckExact(PyTuple_GET_ITEM(p, P_START)) || !PyFloat_CheckExact(PyTuple_GET_ITEM(p, P_LEFT))) goto bail;
    /* the model runner's time: on the output (a worker process), or kept in-process under the step's key */
    if (LOOKUP_ATTR(model_out, model_attr, &model) < 0) goto bail;
    if (model == NULL || model == Py_None) {
        Py_CLEAR(model);
        if ((models = PyObject_GetAttr(hooks, s_model)) == NULL || !PyDict_CheckExact(models)) goto bail;
        if (PyDict_GET_SIZE(models)) {
            model = PyDict_GetItemWithError(models, key);
            if (model == NULL && PyErr_Occurred()) goto bail;
            Py_XINCREF(model);
            model_from_dict = model != NULL;
        }
    }
    if (model != NULL && model != Py_None && !PyFloat_CheckExact(model)) goto bail;  /* CUDA events */
    /* LoRA loads, the drafter's time: the Python path hangs them on the record */
    if (LOOKUP_ATTR(model_out, worker_attr, &facts) < 0 || (facts != NULL && facts != Py_None)) goto bail;
    Py_CLEAR(facts);
    if ((facts = PyObject_GetAttr(hooks, s_timer)) == NULL) goto bail;
    Py_SETREF(facts, PyObject_GetAttr(facts, s_facts));
    if (facts == NULL || (t = truth_of(facts, s_pending)) != 0) goto bail;
    /* the outputs' stamp: any client's, the same; else (none, zero, or before the call) the hook's own */
    entered_d = PyFloat_AS_DOUBLE(entered);
    if (result != Py_None) {
        if (!PyDict_CheckExact(result)) goto bail;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (PyDict_Next(result, &pos, &k, &v)) {
            if ((end = PyObject_GetAttr(v, s_timestamp)) == NULL || !PyFloat_CheckExact(end)) goto bail;
            double d = PyFloat_AS_DOUBLE(end);
            if (d == 0.0 || d < entered_d) Py_CLEAR(end);
        }
    }
    if (end == NULL) {
        end = left;
        Py_INCREF(end);
    }
    if ((prefix = PyObject_GetAttr(hooks, s_prefix)) == NULL) goto bail;
    if ((counter = PyObject_GetAttr(hooks, s_counter)) == NULL || !PyIter_Check(counter)) goto bail;

    /* from here on state changes: errors are reported, not handed to the Python path */
    rc = -1;
    if ((count = PyIter_Next(counter)) == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the step counter ran out");
        goto done;
    }
    if ((step_id = PyNumber_Or(prefix, count)) == NULL) goto done;
    if (PyObject_SetAttr(hooks, s_last_end, left) < 0) goto done;
    start_d = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(p, P_START));
    scheduled_d = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(p, P_LEFT));
    end_d = PyFloat_AS_DOUBLE(end);
    if ((times[0] = PyFloat_FromDouble(scheduled_d - start_d)) == NULL
        || (times[1] = PyFloat_FromDouble(entered_d - scheduled_d)) == NULL
        || (times[2] = PyFloat_FromDouble(end_d - entered_d)) == NULL) goto done;
    /* a StepPayload's fields as a plain tuple (step_wire.StepPayload; step_hooks.updated builds the same) */
    payload = PyTuple_Pack(14, step_id, PyTuple_GET_ITEM(p, P_START), end, PyTuple_GET_ITEM(p, P_RUNNING),
                           PyTuple_GET_ITEM(p, P_WAITING), PyTuple_GET_ITEM(p, P_PREEMPTED), PyTuple_GET_ITEM(p, P_KV_CACHE_USAGE),
                           shares, PyTuple_GET_ITEM(p, P_QUEUE_BLOCKED), times[0], times[1], times[2],
                           PyTuple_GET_ITEM(p, P_IDLE_S), model ? model : Py_None);
    if (payload == NULL) goto done;
    if (PyDict_DelItem(pending, key) < 0) goto done;
    if (model_from_dict && PyDict_DelItem(models, key) < 0) goto done;
    if ((sent = PyObject_CallOneArg(sink, payload)) == NULL) goto done;
    rc = 1;
    goto done;
bail:
    PyErr_Clear();
    rc = 0;
done:
    Py_XDECREF(o); Py_XDECREF(sink); Py_XDECREF(pending); Py_XDECREF(key); Py_XDECREF(model); Py_XDECREF(models);
    Py_XDECREF(facts); Py_XDECREF(end); Py_XDECREF(prefix); Py_XDECREF(counter); Py_XDECREF(count);
    Py_XDECREF(step_id); Py_XDECREF(payload); Py_XDECREF(sent);
    Py_XDECREF(times[0]); Py_XDECREF(times[1]); Py_XDECREF(times[2]);
    return rc;
}

static PyObject *update(HookMethod *self, PyObject *const *args, size_t nargs) {
    PyObject *clock = NULL, *entered = NULL, *left = NULL, *result;
    /* a verify step of speculative decoding: its drafts are counted before the call (the Python hook) */
    int t = truth_of(self->hooks, s_spec_on);
    if (t != 0) {
        if (t > 0) {
            PyObject *drafts = PyObject_GetAttr(args[1], s_scheduled_spec_decode_tokens);
            t = drafts == NULL ? -1 : PyObject_IsTrue(drafts);
            Py_XDECREF(drafts);
        }
        if (t != 0) {
            PyErr_Clear();
            return whole_python(self, s_update_from_output, args, (Py_ssize_t)nargs, NULL);
        }
    }
    if ((clock = PyObject_GetAttr(self->hooks, s_clock)) == NULL || (entered = PyObject_CallNoArgs(clock)) == NULL) {
        PyErr_Clear();
        Py_XDECREF(clock);
        return PyObject_Vectorcall(self->original, args, nargs, NULL);
    }
    result = PyObject_Vectorcall(self->original, args, nargs, NULL);
    if (result == NULL) goto done;
    if ((left = PyObject_CallNoArgs(clock)) == NULL) {
        PyErr_Clear();
        goto done;
    }
    int rc = send_step(self->hooks, args[1], args[2], result, entered, left);
    if (rc < 0) {
        report(self, where_update);
    } else if (rc == 0) {
        PyObject *r = PyObject_CallMethodObjArgs(self->hooks, s_updated, args[1], args[2], result, entered, left,
                                                 Py_None, NULL);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(clock);
    Py_XDECREF(entered);
    Py_XDECREF(left);
    return result;
}

/* -- speculative decoding's counts ------------------------------------------------------------------------ */

static PyObject *len_list(Py_ssize_t n, PyObject *const *objs, int less_one, int *zero) {
    /* [len(o) (- 1)] of n objects; *zero set when a length is 0 */
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = PyObject_Size(objs[i]);
        if (k < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (k == 0) *zero = 1;
        PyObject *v = PyLong_FromSsize_t(k - less_one);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *spec_counts(PyObject *Py_UNUSED(module), PyObject *args) {
    /* step_extras.spec_counts' common step, as its Python lines count it: every drafting request known to the
     * model runner and scheduled, with drafts and sampled tokens, none invalidated, one token sampled a step:
     * (ids, drafted, accepted), else None (the Python loop decides). The same exceptions where Python raises. */
    PyObject *drafts, *sampled, *index, *scheduled;
    if (!PyArg_ParseTuple(args, "O!OO!O!:spec_counts", &PyDict_Type, &drafts, &sampled, &PyDict_Type, &index,
                          &PyDict_Type, &scheduled))
        return NULL;
    Py_ssize_t n = PyDict_GET_SIZE(drafts), pos = 0, i = 0;
    PyObject *ids = PyList_New(n), *rows = NULL, *draft_lists = NULL, *drafted = NULL, *accepted = NULL;
    PyObject *k, *v, *result = NULL;
    int zero = 0;
    if (ids == NULL) return NULL;
    if ((rows = PyList_New(n)) == NULL || (draft_lists = PyList_New(n)) == NULL) goto done;
    while (PyDict_Next(drafts, &pos, &k, &v)) {
        if (i >= n) goto fallback;  /* the dict changed under us */
        PyObject *at = PyDict_GetItemWithError(index, k);
        if (at == NULL || at == Py_None) {
            if (PyErr_Occurred()) goto done;
            goto fallback;  /* not known to the model runner */
        }
        int in = PyDict_Contains(scheduled, k);
        if (in < 0) goto done;
        if (!in) goto fallback;
        PyObject *row = PyObject_GetItem(sampled, at);  /* sampled[index[rid]]: IndexError as in Python */
        if (row == NULL) goto done;
        Py_INCREF(k);
        PyList_SET_ITEM(ids, i, k);
        PyList_SET_ITEM(rows, i, row);
        Py_INCREF(v);
        PyList_SET_ITEM(draft_lists, i, v);
        i++;
    }
    if (i != n) goto fallback;
    if ((drafted = len_list(n, &PyList_GET_ITEM(draft_lists, 0), 0, &zero)) == NULL) goto done;
    if ((accepted = len_list(n, &PyList_GET_ITEM(rows, 0), 1, &zero)) == NULL) goto done;
    if (zero) goto fallback;
    result = PyTuple_Pack(3, ids, drafted, accepted);
    goto done;
fallback:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(ids); Py_XDECREF(rows); Py_XDECREF(draft_lists); Py_XDECREF(drafted); Py_XDECREF(accepted);
    return result;
}

/* -- the method object ----------------------------------------------------------------------------------- */

static PyObject *hm_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    HookMethod *self = (HookMethod *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || !is_on(self))  /* unbound misuse raises as the original does; disarmed: the original */
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (self->kind == SCHEDULE) {
        if (kwnames != NULL && PyTuple_GET_SIZE(kwnames))
            return whole_python(self, s_schedule, args, nargs, kwnames);
        return schedule(self, args, nargs);
    }
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)))  /* not as vLLM's EngineCore calls it */
        return whole_python(self, s_update_from_output, args, nargs, kwnames);
    return update(self, args, nargs);
}

static PyObject *hm_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    int kind;
    PyObject *original, *hooks, *table;
    static char *kwlist[] = {"kind", "original", "hooks", "table", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOO:HookMethod", kwlist, &kind, &original, &hooks, &table))
        return NULL;
    if (kind != SCHEDULE && kind != UPDATE) {
        PyErr_SetString(PyExc_ValueError, "kind: 0 (schedule) or 1 (update_from_output)");
        return NULL;
    }
    if (!PyCallable_Check(original)) {
        PyErr_SetString(PyExc_TypeError, "original: a callable");
        return NULL;
    }
    HookMethod *self = (HookMethod *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = hm_vectorcall;
    self->kind = kind;
    Py_INCREF(original); self->original = original;
    Py_INCREF(hooks); self->hooks = hooks;
    Py_INCREF(table); self->table = table;
    return (PyObject *)self;
}

static int hm_traverse(HookMethod *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->hooks);
    Py_VISIT(self->table);
    return 0;
}

static int hm_clear(HookMethod *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->table);
    return 0;
}

static void hm_dealloc(HookMethod *self) {
    PyObject_GC_UnTrack(self);
    hm_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *hm_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type)) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *hm_forward(HookMethod *self, void *name) {  /* __name__ & co.: the original's */
    if (self->original == NULL) Py_RETURN_NONE;
    return PyObject_GetAttr(self->original, *(PyObject **)name);
}

static PyGetSetDef hm_getset[] = {
    {"__name__", (getter)hm_forward, NULL, NULL, &s___name__},
    {"__qualname__", (getter)hm_forward, NULL, NULL, &s___qualname__},
    {"__module__", (getter)hm_forward, NULL, NULL, &s___module__},
    {"__doc__", (getter)hm_forward, NULL, NULL, &s___doc__},
    {NULL}
};

static PyMemberDef hm_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(HookMethod, original), READONLY, NULL},
    {NULL}
};

static PyTypeObject HookMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_llm.instrumentation.vllm._hooks_fast.HookMethod",
    .tp_basicsize = sizeof(HookMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = hm_new,
    .tp_dealloc = (destructor)hm_dealloc,
    .tp_traverse = (traverseproc)hm_traverse,
    .tp_clear = (inquiry)hm_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(HookMethod, vectorcall),
    .tp_descr_get = hm_descr_get,
    .tp_getset = hm_getset,
    .tp_members = hm_members,
};

static PyObject *setup(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *a[6];
    if (!PyArg_ParseTuple(args, "OOOOUU:setup", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5])) return NULL;
    if (!PyCallable_Check(a[0]) || !PyCallable_Check(a[1]) || !PyTuple_CheckExact(a[3])) {
        PyErr_SetString(PyExc_TypeError, "setup(queue_blocked, tokens, BLOCKED_NONE, (), model attr, facts attr)");
        return NULL;
    }
    PyObject **slots[6] = {&queue_blocked, &tokens_of, &blocked_none, &no_share, &model_attr, &worker_attr};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(a[i]);
        Py_XSETREF(*slots[i], a[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(queue_blocked, tokens, BLOCKED_NONE, empty share tuple, MODEL_TIME_ATTR, WORKER_FACTS_ATTR)"},
    {"spec_counts", spec_counts, METH_VARARGS,
     "spec_counts(drafts, sampled, index, scheduled) -> (ids, drafted, accepted) or None: step_extras.spec_counts"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_hooks_fast", NULL, -1, methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hooks_fast(void) {
#define INTERN(n) if ((s_##n = PyUnicode_InternFromString(#n)) == NULL) return NULL;
    NAMES(INTERN)
    if ((where_schedule = PyUnicode_InternFromString("scheduler.schedule hook")) == NULL) return NULL;
    if ((where_update = PyUnicode_InternFromString("scheduler.update_from_output hook")) == NULL) return NULL;
    if (PyType_Ready(&HookMethodType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&HookMethodType);
    if (PyModule_AddObject(m, "HookMethod", (PyObject *)&HookMethodType) < 0) {
        Py_DECREF(&HookMethodType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
