//! The only unsafe code of the engine: the link-time wrapper of
//! `ggml_backend_sched_graph_compute`, ggml's scheduler eval callback, the graph snapshot and the
//! tensor reads, and thin calls into whisper.cpp's C API.
//!
//! whisper.cpp keeps its four ggml schedulers (conv, encode, cross, decode) inside the opaque
//! `whisper_state` and exposes no eval callback. Every graph it computes goes through
//! `ggml_backend_sched_graph_compute(sched, graph)` (src/whisper.cpp,
//! `ggml_graph_compute_helper`); `-Wl,--wrap=ggml_backend_sched_graph_compute` (build.rs)
//! sends those calls here. [`__wrap_ggml_backend_sched_graph_compute`] snapshots the graph,
//! recognizes its checkpoints ([`crate::graph`]), reads the input leaves (already set by then),
//! installs `ggml_backend_sched_set_eval_callback` on that scheduler asking only for the recognized
//! nodes, and calls `__real_ggml_backend_sched_graph_compute`. With capture off, it clears the
//! callback and calls the real function: the graph computes as if nothing were linked in.
//!
//! ggml computes a graph with an eval callback in pieces, each ending at a node the callback asked
//! for (ggml/src/ggml-backend.cpp, `ggml_backend_sched_compute_splits`), and hands the callback
//! that node right after computing it, before any later node can reuse its buffer.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::Mutex;
use xray_core::Step;

use whisper_rs_sys as sys;

use crate::graph::{self, Dims, Graph, Kind, Reduced, Shape, Tap, TensorInfo};

/// A captured tensor, with what ggml said about it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Dump name.
    pub name: String,
    /// Step.
    pub step: Step,
    /// Tap (layout, shape, op).
    pub tap: Tap,
    /// C-order values, converted to f32.
    pub data: Vec<f32>,
    /// The ggml node's type, op and its sources' types.
    pub ggml: NodeMeta,
}

/// What ggml records about a captured node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeMeta {
    /// ggml type of the tensor (`f32`, `f16`, `i32`).
    pub ty: String,
    /// `ggml_op_desc`.
    pub op: String,
    /// ggml `ne`.
    pub ne: [i64; 4],
    /// The sources' (op, type).
    pub src: Vec<(String, String)>,
}

/// One graph computed during the session.
#[derive(Debug, Clone)]
pub struct GraphRecord {
    /// Which graph.
    pub kind: Kind,
    /// Step it belongs to.
    pub step: Step,
    /// Nodes in it.
    pub nodes: usize,
    /// Nodes the callback asked for.
    pub tapped: usize,
    /// Ops below f32, with the node's meta.
    pub reduced: Vec<(Reduced, NodeMeta)>,
}

/// Capture state shared by the wrapper and the callback (one whisper context at a time).
#[derive(Debug)]
pub struct Session {
    /// Model dimensions.
    pub dims: Dims,
    /// Flash attention on.
    pub flash: bool,
    /// Capture op-level points too.
    pub ops: bool,
    /// Taps on (false: count graphs only, compute untouched).
    pub taps: bool,
    /// Only these names are kept (None: all).
    pub only: Option<Vec<String>>,
    /// Let an f32 model's conv graph run: give each f16 IM2COL whose kernel is f32 a shape-only
    /// f16 stand-in kernel (see [`im2col_stub`]). Off: such a graph is refused before it aborts.
    pub im2col_stub: bool,
    /// IM2COL nodes given the stand-in (graph edits made).
    pub stubbed: usize,
    /// Current step (0: encoder + prefill).
    pub step: Step,
    /// (tokens, past) of the current decode call.
    pub decode: Option<(usize, usize)>,
    /// Captured tensors.
    pub captured: Vec<Captured>,
    /// Graphs seen.
    pub graphs: Vec<GraphRecord>,
    /// The first recognition error.
    pub error: Option<String>,
    wanted: HashMap<usize, Vec<Tap>>,
    captured_meta: HashMap<usize, NodeMeta>,
}

impl Session {
    /// A session for a model.
    pub fn new(dims: Dims, flash: bool, ops: bool, taps: bool) -> Session {
        Session {
            dims,
            flash,
            ops,
            taps,
            only: None,
            im2col_stub: false,
            stubbed: 0,
            step: 0,
            decode: None,
            captured: vec![],
            graphs: vec![],
            error: None,
            wanted: HashMap::new(),
            captured_meta: HashMap::new(),
        }
    }

    fn keep(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|n| n == name))
    }
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

fn session() -> std::sync::MutexGuard<'static, Option<Session>> {
    SESSION.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs a session (replacing any), returns the previous.
pub fn install(s: Option<Session>) -> Option<Session> {
    std::mem::replace(&mut *session(), s)
}

/// Runs `f` on the installed session.
pub fn with<T>(f: impl FnOnce(&mut Session) -> T) -> Option<T> {
    session().as_mut().map(f)
}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml and whisper.cpp return NUL-terminated static or tensor-owned strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn type_name(ty: sys::ggml_type) -> String {
    // SAFETY: ggml_type_name returns a static string for any type value.
    cstr(unsafe { sys::ggml_type_name(ty) })
}

/// Reads one tensor's header (op, type, shape, name, sources).
///
/// # Safety
/// `t` must point to a live `ggml_tensor`.
unsafe fn header(t: *const sys::ggml_tensor) -> (sys::ggml_tensor, String, String) {
    // SAFETY: the caller guarantees `t` is live; the struct is plain data.
    let h = unsafe { *t };
    // SAFETY: as above; ggml_op_desc reads the tensor's op and op_params only.
    let op = cstr(unsafe { sys::ggml_op_desc(t) });
    let name = cstr(h.name.as_ptr());
    (h, op, name)
}

/// Snapshot of a graph: every node, and every tensor a node reads or views (one level).
///
/// # Safety
/// `g` must be a graph being computed (all its tensors live).
unsafe fn snapshot(g: *mut sys::ggml_cgraph) -> (Graph, Vec<*mut sys::ggml_tensor>) {
    let mut out = Graph::default();
    let mut ptrs: Vec<*mut sys::ggml_tensor> = vec![];
    let mut index: HashMap<usize, usize> = HashMap::new();
    // SAFETY: the graph is live for the duration of the compute call.
    let n = unsafe { sys::ggml_graph_n_nodes(g) };
    let mut nodes = vec![];
    for i in 0..n {
        // SAFETY: 0 <= i < n_nodes.
        nodes.push(unsafe { sys::ggml_graph_node(g, i) });
    }
    fn intern(
        p: *mut sys::ggml_tensor,
        out: &mut Graph,
        ptrs: &mut Vec<*mut sys::ggml_tensor>,
        index: &mut HashMap<usize, usize>,
    ) -> usize {
        if let Some(&i) = index.get(&(p as usize)) {
            return i;
        }
        // SAFETY: `p` is a node of the live graph or a source / view source of one.
        let (h, op, name) = unsafe { header(p) };
        let id = out.t.len();
        index.insert(p as usize, id);
        ptrs.push(p);
        out.t.push(TensorInfo {
            ptr: p as usize,
            op,
            ty: type_name(h.type_),
            ne: h.ne,
            name,
            src: vec![],
            view_src: None,
            view_offs: h.view_offs,
            node: None,
        });
        id
    }
    for (i, &p) in nodes.iter().enumerate() {
        let id = intern(p, &mut out, &mut ptrs, &mut index);
        out.t[id].node = Some(i);
        out.nodes.push(id);
    }
    // Sources of every node; view sources of every tensor (a view's source may be a view).
    let mut k = 0;
    while k < out.t.len() {
        let p = ptrs[k];
        // SAFETY: every interned pointer is live (see above).
        let (h, _, _) = unsafe { header(p) };
        if out.t[k].node.is_some() {
            let last = h
                .src
                .iter()
                .rposition(|s| !s.is_null())
                .map_or(0, |i| i + 1);
            let mut src = vec![];
            for &s in &h.src[..last] {
                src.push(if s.is_null() {
                    None
                } else {
                    Some(intern(s, &mut out, &mut ptrs, &mut index))
                });
            }
            out.t[k].src = src;
        }
        if !h.view_src.is_null() {
            let v = intern(h.view_src, &mut out, &mut ptrs, &mut index);
            out.t[k].view_src = Some(v);
        }
        k += 1;
    }
    (out, ptrs)
}

/// Reads a tensor's values (any strides) in C order of `[ne3, ne2, ne1, ne0]`, as f32.
///
/// # Safety
/// `t` must be a live, computed host tensor.
unsafe fn read(t: *const sys::ggml_tensor) -> Result<Vec<f32>, String> {
    // SAFETY: the caller guarantees `t` is live.
    let h = unsafe { *t };
    if h.data.is_null() {
        return Err("tensor has no data".into());
    }
    let ne: Vec<usize> = h.ne.iter().map(|&n| n.max(0) as usize).collect();
    let mut out = Vec::with_capacity(ne.iter().product());
    let base = h.data as *const u8;
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let off = i0 * h.nb[0] + i1 * h.nb[1] + i2 * h.nb[2] + i3 * h.nb[3];
                    // SAFETY: the offset is inside the tensor's extent (ne/nb describe it).
                    let p = unsafe { base.add(off) };
                    let v = match h.type_ {
                        // SAFETY: an f32 element at `p` (possibly unaligned in a view).
                        sys::ggml_type_GGML_TYPE_F32 => unsafe {
                            (p as *const f32).read_unaligned()
                        },
                        sys::ggml_type_GGML_TYPE_F16 => {
                            // SAFETY: an f16 element at `p`.
                            let bits = unsafe { (p as *const u16).read_unaligned() };
                            // SAFETY: ggml's own f16 -> f32 conversion, a pure function.
                            unsafe { sys::ggml_fp16_to_fp32(bits) }
                        }
                        // SAFETY: an i32 element at `p`.
                        sys::ggml_type_GGML_TYPE_I32 => unsafe {
                            (p as *const i32).read_unaligned() as f32
                        },
                        other => return Err(format!("ggml type {} is not read", type_name(other))),
                    };
                    out.push(v);
                }
            }
        }
    }
    Ok(out)
}

fn meta(g: &Graph, id: usize) -> NodeMeta {
    let t = &g.t[id];
    NodeMeta {
        ty: t.ty.clone(),
        op: t.op.clone(),
        ne: t.ne,
        src: t
            .src
            .iter()
            .flatten()
            .map(|&s| (g.t[s].op.clone(), g.t[s].ty.clone()))
            .collect(),
    }
}

/// Turns a tensor's raw values into the tap's shape (the probabilities cropped to the positions
/// that exist; the masked padding asserted zero).
fn shaped(tap: &Tap, data: Vec<f32>) -> Result<Vec<f32>, String> {
    match &tap.shape {
        Shape::As(shape) => {
            let n: usize = shape.iter().product();
            if n != data.len() {
                return Err(format!(
                    "{}: {} values for shape {shape:?}",
                    tap.name,
                    data.len()
                ));
            }
            Ok(data)
        }
        Shape::CropKv {
            heads,
            tokens,
            n_kv,
            keep,
        } => {
            if data.len() != heads * tokens * n_kv {
                return Err(format!(
                    "{}: {} values, expected {heads}x{tokens}x{n_kv}",
                    tap.name,
                    data.len()
                ));
            }
            let mut out = Vec::with_capacity(heads * tokens * keep);
            for row in data.chunks(*n_kv) {
                if let Some((j, v)) = row[*keep..].iter().enumerate().find(|(_, v)| **v != 0.0) {
                    return Err(format!(
                        "{}: probability {v} at padded KV column {} (beyond the {keep} positions)",
                        tap.name,
                        keep + j
                    ));
                }
                out.extend_from_slice(&row[..*keep]);
            }
            Ok(out)
        }
    }
}

unsafe extern "C" {
    fn __real_ggml_backend_sched_graph_compute(
        sched: sys::ggml_backend_sched_t,
        graph: *mut sys::ggml_cgraph,
    ) -> sys::ggml_status;
}

unsafe extern "C" fn eval_callback(t: *mut sys::ggml_tensor, ask: bool, _ud: *mut c_void) -> bool {
    let mut guard = session();
    let Some(s) = guard.as_mut() else {
        return !ask;
    };
    if ask {
        return s.wanted.contains_key(&(t as usize));
    }
    let Some(taps) = s.wanted.get(&(t as usize)).cloned() else {
        return true;
    };
    // SAFETY: ggml hands the callback the node it just computed (synchronized), live and on the
    // host (CPU backend).
    let raw = unsafe { read(t) };
    for tap in taps {
        let r = raw.clone().and_then(|d| shaped(&tap, d));
        match r {
            Ok(data) => {
                let ggml = s
                    .captured_meta
                    .get(&(t as usize))
                    .cloned()
                    .unwrap_or(NodeMeta {
                        ty: String::new(),
                        op: String::new(),
                        ne: [0; 4],
                        src: vec![],
                    });
                s.captured.push(Captured {
                    name: tap.name.clone(),
                    step: s.step,
                    tap,
                    data,
                    ggml,
                });
            }
            Err(e) => {
                s.error.get_or_insert(format!("reading {}: {e}", tap.name));
            }
        }
    }
    true
}

/// The link-time wrapper (build.rs: `-Wl,--wrap=ggml_backend_sched_graph_compute`).
///
/// # Safety
/// Called by whisper.cpp with its scheduler and a graph allocated on it.
#[no_mangle]
pub unsafe extern "C" fn __wrap_ggml_backend_sched_graph_compute(
    sched: sys::ggml_backend_sched_t,
    graph: *mut sys::ggml_cgraph,
) -> sys::ggml_status {
    let mut restore: Vec<(*mut sys::ggml_tensor, *mut sys::ggml_tensor)> = vec![];
    let install_cb = {
        let mut guard = session();
        match guard.as_mut() {
            Some(s) => {
                // SAFETY: the graph is being computed: every tensor it references is live.
                let (g, ptrs) = unsafe { snapshot(graph) };
                match graph::recognize(&g, &s.dims, s.flash, s.ops, s.decode) {
                    Ok((kind, found)) => {
                        let mut rec = GraphRecord {
                            kind,
                            step: s.step,
                            nodes: g.nodes.len(),
                            tapped: 0,
                            reduced: found
                                .reduced
                                .iter()
                                .map(|r| (r.clone(), meta(&g, r.id)))
                                .collect(),
                        };
                        s.wanted.clear();
                        s.captured_meta.clear();
                        if s.taps {
                            // Inputs are set before the compute: read them now.
                            let inputs: Vec<Tap> = found
                                .inputs
                                .iter()
                                .filter(|t| s.keep(&t.name))
                                .cloned()
                                .collect();
                            for tap in &inputs {
                                // SAFETY: an input leaf of the live graph, on the host.
                                let r = unsafe { read(ptrs[tap.id]) }.and_then(|d| shaped(tap, d));
                                match r {
                                    Ok(data) => s.captured.push(Captured {
                                        name: tap.name.clone(),
                                        step: s.step,
                                        tap: tap.clone(),
                                        data,
                                        ggml: meta(&g, tap.id),
                                    }),
                                    Err(e) => {
                                        s.error.get_or_insert(format!("reading {}: {e}", tap.name));
                                    }
                                }
                            }
                            let taps: Vec<Tap> =
                                found.taps.into_iter().filter(|t| s.keep(&t.name)).collect();
                            for tap in taps {
                                let p = ptrs[tap.id] as usize;
                                s.captured_meta.insert(p, meta(&g, tap.id));
                                s.wanted.entry(p).or_default().push(tap);
                            }
                            rec.tapped = s.wanted.len();
                        }
                        s.graphs.push(rec);
                    }
                    Err(e) => {
                        s.error
                            .get_or_insert(format!("graph recognition (step {}): {e}", s.step));
                        s.wanted.clear();
                    }
                }
                // whisper.cpp 1.8.3 cannot compute an f32 model's conv graph: ggml_conv_1d (ggml.c)
                // always builds an f16 IM2COL, and ggml_compute_forward_im2col_f16
                // (ggml-cpu/ops.cpp) asserts an f16 kernel (GGML_ASSERT(src0->type == F16)), which
                // whisper_model_load allocates f32 for ftype 0. Refuse the graph (the process
                // would abort), or with the stub let it run unchanged in value.
                for (id, &p) in g.nodes.iter().map(|&i| (i, &ptrs[i])) {
                    let t = &g.t[id];
                    let k = t.src.first().copied().flatten();
                    if t.op == "IM2COL" && t.ty == "f16" && k.is_some_and(|k| g.t[k].ty != "f16") {
                        if !s.im2col_stub {
                            s.error.get_or_insert(format!(
                                "{} would abort whisper.cpp: an f16 IM2COL with an {} kernel \
                                 (ggml-cpu/ops.cpp ggml_compute_forward_im2col_f16 asserts src0 f16; \
                                 ggml.c ggml_conv_1d always asks for an f16 im2col; whisper_model_load \
                                 allocates the conv kernels f32 for an f32 model): whisper.cpp cannot \
                                 run this f32 model (--im2col-stub runs it)",
                                g.describe(id),
                                g.t[k.unwrap_or(id)].ty
                            ));
                            return sys::ggml_status_GGML_STATUS_FAILED;
                        }
                        // SAFETY: `p` is a live IM2COL node; its src[0] is replaced for this compute
                        // only and restored below.
                        match unsafe { im2col_stub(p) } {
                            Ok(old) => {
                                restore.push((p, old));
                                s.stubbed += 1;
                            }
                            Err(e) => {
                                s.error.get_or_insert(e);
                                return sys::ggml_status_GGML_STATUS_FAILED;
                            }
                        }
                    }
                }
                s.taps && !s.wanted.is_empty()
            }
            None => false,
        }
    };
    // SAFETY: `sched` is whisper.cpp's live scheduler; the callback only reads tensors.
    unsafe {
        if install_cb {
            sys::ggml_backend_sched_set_eval_callback(
                sched,
                Some(eval_callback),
                std::ptr::null_mut(),
            );
        } else {
            sys::ggml_backend_sched_set_eval_callback(sched, None, std::ptr::null_mut());
        }
    }
    // SAFETY: the original function, with the caller's arguments.
    let r = unsafe { __real_ggml_backend_sched_graph_compute(sched, graph) };
    for (node, old) in restore {
        // SAFETY: restores the IM2COL node's own kernel pointer.
        unsafe { (*node).src[0] = old };
    }
    r
}

struct StubCtx(#[allow(dead_code)] *mut sys::ggml_context);
// SAFETY: the context is only used under the STUBS mutex.
unsafe impl Send for StubCtx {}
static STUBS: Mutex<Vec<StubCtx>> = Mutex::new(vec![]);

/// Gives an IM2COL node a shape-only f16 stand-in for its f32 kernel (src[0]) and returns the
/// original. ggml_compute_forward_im2col_f16 reads the kernel's type (the assert) and its `ne`
/// (the kernel size), never its data, so the node computes exactly the values it would compute
/// if ggml accepted an f32 kernel: the stand-in has the kernel's `ne` and no data. The graph's
/// next MUL_MAT still reads the real f32 kernel (as src1, rounded to f16: vec_dot_type).
///
/// # Safety
/// `node` must be a live IM2COL node of a graph about to be computed.
unsafe fn im2col_stub(node: *mut sys::ggml_tensor) -> Result<*mut sys::ggml_tensor, String> {
    // SAFETY: the caller guarantees `node` is live.
    let old = unsafe { (*node).src[0] };
    // SAFETY: `old` is the node's live kernel.
    let ne = unsafe { (*old).ne };
    // SAFETY: a metadata-only context (no_alloc) for one tensor header, kept for the process.
    let stub = unsafe {
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 2 * sys::ggml_tensor_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        if ctx.is_null() {
            return Err("ggml_init failed for the im2col stand-in".into());
        }
        STUBS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(StubCtx(ctx));
        sys::ggml_new_tensor(ctx, sys::ggml_type_GGML_TYPE_F16, 4, ne.as_ptr())
    };
    if stub.is_null() {
        return Err("ggml_new_tensor failed for the im2col stand-in".into());
    }
    // SAFETY: replaces the node's kernel pointer for this compute; the caller restores it.
    unsafe { (*node).src[0] = stub };
    Ok(old)
}

/// whisper.cpp's log, silenced unless `XRAY_WHISPERCPP_LOG` is set.
unsafe extern "C" fn quiet_log(
    _level: sys::ggml_log_level,
    text: *const std::os::raw::c_char,
    _ud: *mut c_void,
) {
    if std::env::var_os("XRAY_WHISPERCPP_LOG").is_some() {
        eprint!("{}", cstr(text));
    }
}

/// A whisper.cpp context (freed on drop).
pub struct Context {
    ctx: *mut sys::whisper_context,
}

impl Context {
    /// Loads a ggml model file with the CPU backend, flash attention on or off.
    pub fn load(path: &std::path::Path, flash: bool) -> Result<Context, String> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: plain C calls; the log callback is a static function.
        let ctx = unsafe {
            sys::whisper_log_set(Some(quiet_log), std::ptr::null_mut());
            let mut p = sys::whisper_context_default_params();
            p.use_gpu = false;
            p.flash_attn = flash;
            p.dtw_token_timestamps = false;
            sys::whisper_init_from_file_with_params(c.as_ptr(), p)
        };
        if ctx.is_null() {
            return Err(format!(
                "whisper.cpp could not load {} (set XRAY_WHISPERCPP_LOG=1 for its log)",
                path.display()
            ));
        }
        Ok(Context { ctx })
    }

    /// whisper.cpp's own log-mel of 16 kHz mono samples.
    pub fn pcm_to_mel(&self, samples: &[f32], threads: i32) -> Result<(), String> {
        let n = i32::try_from(samples.len()).map_err(|_| "too many samples".to_string())?;
        // SAFETY: `samples` is valid for `n` floats; ctx is live.
        let r = unsafe { sys::whisper_pcm_to_mel(self.ctx, samples.as_ptr(), n, threads) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| format!("whisper_pcm_to_mel returned {r}"))
    }

    /// Feeds a log-mel `[n_mel, n_len]` (row per mel bin).
    pub fn set_mel(&self, data: &[f32], n_len: i32, n_mel: i32) -> Result<(), String> {
        // SAFETY: `data` holds n_len * n_mel floats (checked by the caller); ctx is live.
        let r = unsafe { sys::whisper_set_mel(self.ctx, data.as_ptr(), n_len, n_mel) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| format!("whisper_set_mel returned {r}"))
    }

    /// Runs the encoder (conv, blocks, cross K/V) from mel frame 0.
    pub fn encode(&self, threads: i32) -> Result<(), String> {
        // SAFETY: ctx is live.
        let r = unsafe { sys::whisper_encode(self.ctx, 0, threads) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| format!("whisper_encode returned {r}"))
    }

    /// One decoder call; returns the last token's logits (whisper.cpp fills only that row of
    /// `whisper_get_logits`'s `[n_tokens, n_vocab]`: src/whisper.cpp `whisper_batch_prep_legacy`
    /// sets `logits` for the last token only, `whisper_decode_internal` copies flagged rows).
    pub fn decode(
        &self,
        tokens: &[i32],
        past: i32,
        threads: i32,
        vocab: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), String> {
        let n = i32::try_from(tokens.len()).map_err(|_| "too many tokens".to_string())?;
        // SAFETY: `tokens` is valid for `n` ids; ctx is live.
        let r = unsafe { sys::whisper_decode(self.ctx, tokens.as_ptr(), n, past, threads) };
        if r != 0 {
            return Err(format!("whisper_decode returned {r}"));
        }
        // SAFETY: after a successful decode, whisper_get_logits points at n_tokens * n_vocab floats.
        let all = unsafe {
            std::slice::from_raw_parts(sys::whisper_get_logits(self.ctx), tokens.len() * vocab)
        };
        let last = all[(tokens.len() - 1) * vocab..].to_vec();
        let first = all[..vocab].to_vec();
        Ok((last, first))
    }

    /// The bytes of a token (whisper.cpp's vocabulary, as the model file carries it).
    pub fn token_bytes(&self, id: i32) -> Vec<u8> {
        // SAFETY: ctx is live; whisper_token_to_str returns a vocabulary-owned string.
        let p = unsafe { sys::whisper_token_to_str(self.ctx, id) };
        if p.is_null() {
            return vec![];
        }
        // SAFETY: NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_bytes().to_vec()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from whisper_init_from_file_with_params and is freed once.
        unsafe { sys::whisper_free(self.ctx) }
    }
}

/// whisper.cpp's version string.
pub fn whisper_version() -> String {
    // SAFETY: static string.
    cstr(unsafe { sys::whisper_version() })
}

/// ggml's CPU feature line (whisper_print_system_info).
pub fn system_info() -> String {
    // SAFETY: static string.
    cstr(unsafe { sys::whisper_print_system_info() })
}
