//! Human renderings of evidence: one self-contained HTML page ([`html`]: inline CSS and SVG, no
//! network) and Markdown for a pull-request comment ([`markdown`]).

use std::fmt::Write as _;
use xray_core::Step;

use crate::evidence::{CheckpointEvidence, Evidence, Verdict};
use crate::localize::Status;

/// Rows of the Markdown checkpoint table before it is cut.
pub const MARKDOWN_MAX_ROWS: usize = 25;
/// Rows of the Markdown per-step table before it is cut.
pub const MARKDOWN_MAX_STEPS: usize = 20;

/// Formats a metric: 3 significant digits, `0`, or `inf` for the zero-reference sentinel.
pub fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x >= f64::MAX {
        "inf".into()
    } else {
        format!("{x:.2e}")
    }
}

fn esc_html(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Escapes untrusted text for a Markdown table cell or line: pipes, backticks, emphasis, links,
/// headings and strike-through backslash-escaped, HTML's `<`, `>` and `&` as entities, newlines
/// as spaces. Nothing in it can open a code span, a link, an image or an HTML tag.
pub(crate) fn esc_md(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '`' | '*' | '_' | '[' | ']' | '\\' | '~' | '#' => {
                o.push('\\');
                o.push(c);
            }
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '\n' | '\r' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Untrusted text as a Markdown code span nothing in it can close: fenced by one backtick more
/// than its longest run of backticks, padded with a space when it starts or ends with a backtick
/// (or with a space at both ends), newlines as spaces; in a table `cell`, `|` escaped (GFM
/// splits a row into cells before it reads code spans). Inside a code span HTML is text.
pub(crate) fn md_code(s: &str, cell: bool) -> String {
    let mut t: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if cell {
        t = t.replace('|', "\\|");
    }
    let (mut longest, mut run) = (0usize, 0usize);
    for c in t.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = t.is_empty()
        || t.starts_with('`')
        || t.ends_with('`')
        || (t.starts_with(' ') && t.ends_with(' ') && !t.trim().is_empty());
    if pad {
        format!("{fence} {t} {fence}")
    } else {
        format!("{fence}{t}{fence}")
    }
}

fn status_colour(s: Status) -> &'static str {
    match s {
        Status::Pass => "#2e7d32",
        Status::Origin => "#c62828",
        Status::Fail => "#ad1457",
        Status::Propagated => "#ef6c00",
        Status::Missing => "#6d6d6d",
        Status::AlignmentFault => "#6a1b9a",
        Status::Unobserved => "#b0bec5",
        Status::NotComparable => "#90a4ae",
    }
}

fn verdict_badge(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "✅ pass",
        Verdict::Diverged => "❌ diverged",
        Verdict::Error => "⚠️ error",
    }
}

/// The statuses in the order both renderings list them (counts, the plot's legend).
const STATUS_ORDER: [Status; 8] = [
    Status::Pass,
    Status::Origin,
    Status::Fail,
    Status::Propagated,
    Status::AlignmentFault,
    Status::Missing,
    Status::Unobserved,
    Status::NotComparable,
];

/// The statuses a depth plot draws a point for (those with a measured error or a missing one):
/// [`STATUS_ORDER`] but unobserved and not comparable.
const PLOTTED: &[Status] = STATUS_ORDER.split_at(6).0;

/// `"; steps {r} not comparable"` when the token comparison has steps that are not, else empty.
fn not_comparable_tail(t: &crate::evidence::TokenAlignment) -> String {
    t.not_comparable_steps
        .as_ref()
        .map_or(String::new(), |r| format!("; steps {r} not comparable"))
}

/// The token drill-down's sentence after its step, each checkpoint name rendered by `name`
/// (`none` for none).
fn drill_down_checkpoints(d: &crate::localize::DrillDown, name: impl Fn(&str) -> String) -> String {
    let opt = |o: &Option<String>| o.as_deref().map_or("none".into(), &name);
    format!(
        "first divergent checkpoint at that step {}; earliest up to it {}; cause {}",
        opt(&d.first_at_step),
        opt(&d.first_up_to_step),
        opt(&d.cause_up_to_step)
    )
}

/// How a rendering says whether capture left the outputs alone: `yes`, or its own `no` wording.
fn capture_neutral(neutral: bool, no: &'static str) -> &'static str {
    if neutral {
        "yes"
    } else {
        no
    }
}

/// `first divergence: {checkpoint@step} (producer {op})`, as the console lines open it, then
/// what `explained` says of its explanation when it has one.
fn first_divergence_head(
    f: &crate::evidence::FirstDivergence,
    explained: impl Fn(&crate::signatures::Explanation) -> String,
) -> String {
    format!(
        "first divergence: {} (producer {}){}",
        xray_core::key(&f.checkpoint, f.step),
        f.producer,
        f.explanation.as_ref().map(explained).unwrap_or_default()
    )
}

fn status_counts(e: &Evidence) -> String {
    let parts: Vec<String> = STATUS_ORDER
        .iter()
        .filter_map(|s| {
            let n = e.checkpoints.iter().filter(|c| c.status == *s).count();
            (n > 0).then(|| format!("{n} {}", s.as_str()))
        })
        .collect();
    parts.join(", ")
}

/// Plain-text lines on partial coverage, isolation and token alignment (empty when the evidence
/// has none of them), shared by both renderings.
pub fn partial_lines(e: &Evidence) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &e.coverage {
        if c.unobserved + c.not_comparable > 0 {
            out.push(format!(
                "Coverage: {} observed, {} unobserved, {} not comparable (neither pass nor fail); unobserved: {}",
                c.observed,
                c.unobserved,
                c.not_comparable,
                if c.unobserved_names.is_empty() {
                    "none".to_string()
                } else {
                    c.unobserved_names.join(", ")
                }
            ));
        }
    }
    if let Some(t) = &e.tokens {
        let forced = if t.teacher_forced {
            "teacher-forced on the reference's tokens (every step compared)"
        } else {
            "free-running"
        };
        let tail = not_comparable_tail(t);
        out.push(match (t.parted_at_step, t.reference_token, t.candidate_token) {
            (Some(k), None, Some(c)) => format!(
                "Tokens ({forced}): part at step {k}: the reference's tokens end there (candidate {c} goes on): a reference dump with fewer steps, or truncated{tail}"
            ),
            (Some(k), Some(r), None) => format!(
                "Tokens ({forced}): part at step {k}: the candidate's tokens end there (reference {r} goes on){tail}"
            ),
            (Some(k), r, c) => format!(
                "Tokens ({forced}): part at step {k} (reference {}, candidate {}){tail}",
                r.map_or("-".into(), |x| x.to_string()),
                c.map_or("-".into(), |x| x.to_string()),
            ),
            (None, _, _) => format!("Tokens ({forced}): equal"),
        });
    }
    for f in &e.fed {
        out.push(format!(
            "Fed with the reference's tensor: {} in {}{}",
            f.checkpoint,
            f.dump,
            f.into
                .as_ref()
                .map_or(String::new(), |i| format!(" (into {i})"))
        ));
    }
    if let Some(fd) = &e.first_divergence {
        if let Some(r) = &fd.region {
            out.push(format!(
                "Unobserved region {}: {} ({} checkpoint-steps)",
                r.summary,
                r.unobserved.join(", "),
                r.unobserved_count
            ));
        }
        if fd.region.is_some() {
            out.push(format!("Suspects: {}", fd.suspects.join(", ")));
        }
    }
    if let Some(p) = &e.op_points {
        let mut line = p.summary();
        for a in p.alignment_faults.iter().skip(1).take(4) {
            line.push_str(&format!(
                "; {}: {}",
                xray_core::key(&a.point, a.step),
                a.reason
            ));
        }
        out.push(line);
    }
    if let Some(l) = &e.local_errors {
        out.push(l.summary());
    }
    for d in &e.independent {
        out.push(format!(
            "Independent divergence at {}{}; suspects: {}",
            xray_core::key(&d.checkpoint, d.step),
            d.region.as_ref().map_or(String::new(), |r| format!(
                ", unobserved region {}",
                r.summary
            )),
            d.suspects.join(", ")
        ));
    }
    out
}

fn oracle_line(e: &Evidence) -> String {
    match &e.run.oracle {
        Some(o) => {
            let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "?".into());
            format!(
                "python {}, torch {}, transformers {}",
                v(&o.python),
                v(&o.torch),
                v(&o.transformers)
            )
        }
        None => "n/a".into(),
    }
}

/// Markdown for a pull-request comment.
pub fn markdown(e: &Evidence) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## X-Ray: {}\n", verdict_badge(e.effective_verdict()));
    let _ = writeln!(
        s,
        "**{}** · {} · runtime {} · oracle {}\n",
        esc_md(&e.run.family),
        md_code(&e.run.model_path, false),
        md_code(&e.run.runtime_version, false),
        esc_md(&oracle_line(e))
    );
    let _ = writeln!(
        s,
        "{} checkpoints: {}.",
        e.checkpoints.len(),
        status_counts(e)
    );
    if let Some(c) = e.capture_neutral {
        let _ = writeln!(
            s,
            "Capture neutral: {}.",
            capture_neutral(c, "**no** (capture changed the outputs)")
        );
    }
    s.push('\n');
    let partial = partial_lines(e);
    for l in &partial {
        let _ = writeln!(s, "- {}", esc_md(l));
    }
    if !partial.is_empty() {
        s.push('\n');
    }
    if let Some(fd) = &e.first_divergence {
        let _ = writeln!(s, "### First divergence\n");
        let _ = writeln!(
            s,
            "{}, produced by {}.\n",
            md_code(&xray_core::key(&fd.checkpoint, fd.step).to_string(), false),
            md_code(&fd.producer, false)
        );
        if !fd.inputs.is_empty() {
            let _ = writeln!(s, "| input | status |\n|---|---|");
            for i in &fd.inputs {
                let _ = writeln!(
                    s,
                    "| {} | {} |",
                    md_code(&xray_core::key(&i.checkpoint, i.step).to_string(), true),
                    i.status.as_str()
                );
            }
            s.push('\n');
        }
        if let Some(x) = &fd.explanation {
            let _ = writeln!(
                s,
                "**Signature:** {}: {}\n",
                md_code(x.signature.as_str(), false),
                esc_md(&x.detail)
            );
        }
        if let Some(op) = &fd.op {
            let _ = writeln!(
                s,
                "**Op-level origin** (drill-down over {} op-level points): {}\n",
                op.compared,
                esc_md(&op.summary())
            );
            if let Some(r) = &op.replay {
                let _ = writeln!(s, "**Reference {}**\n", esc_md(&r.summary()));
                let _ = writeln!(
                    s,
                    "| replayed op | engine input | local error rel_l2 | verdict |\n|---|---|---|---|"
                );
                for le in std::iter::once(&r.local_error).chain(&r.neighbours) {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} |",
                        md_code(&le.module, true),
                        md_code(&le.inputs.join(", "), true),
                        le.rel_l2.map_or("-".into(), |v| format!("{v:.2e}")),
                        verdict_word(le.verdict)
                    );
                }
                s.push('\n');
            }
        }
    } else if e.effective_verdict() != Verdict::Pass {
        let _ = writeln!(s, "### First divergence\n\n{}\n", not_localized(e));
    }
    if let Some(d) = &e.drill_down {
        let _ = writeln!(
            s,
            "**Token drill-down:** first divergent token at step {}; {}.\n",
            d.token_step,
            drill_down_checkpoints(d, |x| md_code(x, false))
        );
    }
    if let Some(t) = &e.transcript {
        let _ = writeln!(s, "### Transcript\n");
        let _ = writeln!(s, "- reference: \"{}\"", esc_md(&t.reference));
        let _ = writeln!(s, "- runtime: \"{}\"", esc_md(&t.runtime));
        let _ = writeln!(
            s,
            "- tokens equal: {}{}\n",
            if t.tokens_equal { "yes" } else { "no" },
            t.first_divergent_step
                .map(|k| format!(" (first divergent step {k})"))
                .unwrap_or_default()
        );
    }
    let bad: Vec<&CheckpointEvidence> = e
        .checkpoints
        .iter()
        .filter(|c| c.status.is_observed() && c.status != Status::Pass)
        .collect();
    if !bad.is_empty() {
        let _ = writeln!(s, "### Checkpoints not passing\n");
        let _ = writeln!(
            s,
            "| checkpoint | status | max_abs | rel_l2 | cosine | outliers | tolerance |\n|---|---|---|---|---|---|---|"
        );
        for c in bad.iter().take(MARKDOWN_MAX_ROWS) {
            let (ma, rl, co, ou) = match &c.metrics {
                Some(m) => (
                    num(m.max_abs),
                    num(m.rel_l2),
                    format!("{:.6}", m.cosine),
                    format!("{:.3}%", 100.0 * m.beyond_fraction),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {ma} | {rl} | {co} | {ou} | {} |",
                md_code(&c.id(), true),
                c.status.as_str(),
                esc_md(&c.tolerance.source)
            );
        }
        if bad.len() > MARKDOWN_MAX_ROWS {
            let _ = writeln!(s, "\n… and {} more.", bad.len() - MARKDOWN_MAX_ROWS);
        }
        s.push('\n');
    }
    let steps = &e.error_profile.by_step;
    if !steps.is_empty() {
        let _ = writeln!(s, "### Error by step\n");
        let _ = writeln!(s, "| step | max rel_l2 | max max_abs | worst checkpoint | divergent |\n|---|---|---|---|---|");
        for p in steps.iter().take(MARKDOWN_MAX_STEPS) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                p.step,
                num(p.max_rel_l2),
                num(p.max_abs),
                md_code(&p.worst_checkpoint, true),
                p.divergent
            );
        }
        if steps.len() > MARKDOWN_MAX_STEPS {
            let _ = writeln!(
                s,
                "\n… and {} more steps.",
                steps.len() - MARKDOWN_MAX_STEPS
            );
        }
        s.push('\n');
    }
    for n in &e.notes {
        let _ = writeln!(s, "> {}", esc_md(n));
    }
    s
}

const CSS: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px}
.banner{padding:14px 24px;color:#fff;font-size:20px;font-weight:600}
.banner small{display:block;font-size:13px;font-weight:400;opacity:.9}
.pass{background:#2e7d32}.diverged{background:#c62828}.error{background:#8d6e00}
.box{background:#fff;border:1px solid #ddd;border-radius:6px;padding:12px 16px;margin:16px 0}
.wide{overflow-x:auto}
.origin{border-left:6px solid #c62828}
h2{font-size:17px;margin:4px 0 8px}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f1f1f1;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{padding:3px 6px;border-bottom:1px solid #eee;text-align:left;white-space:nowrap}
th{position:sticky;top:0;background:#f5f5f5}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.st{color:#fff;border-radius:3px;padding:0 5px;font-size:11.5px}
tr.origin td{background:#ffebee}
svg{width:100%;height:auto;background:#fff}
.scroll{overflow-x:auto}
.legend span{margin-right:14px}
";

fn status_chip(s: Status) -> String {
    format!(
        "<span class=\"st\" style=\"background:{}\">{}</span>",
        status_colour(s),
        s.as_str()
    )
}

/// SVG plot of `log10(rel_l2)` along graph depth (the checkpoint order of the evidence).
pub fn svg_plot(e: &Evidence) -> String {
    let (w, h) = (1000.0f64, 300.0f64);
    let (l, r, t, b) = (56.0, 12.0, 14.0, 34.0);
    let n = e.checkpoints.len().max(2) as f64;
    let ys: Vec<Option<f64>> = e
        .checkpoints
        .iter()
        .map(|c| {
            c.metrics.as_ref().map(|m| {
                if m.rel_l2 > 0.0 {
                    m.rel_l2.log10().clamp(-12.0, 3.0)
                } else {
                    -12.0
                }
            })
        })
        .collect();
    let lo = ys
        .iter()
        .flatten()
        .copied()
        .fold(0.0f64, f64::min)
        .floor()
        .min(-8.0);
    let hi = ys
        .iter()
        .flatten()
        .copied()
        .fold(-12.0f64, f64::max)
        .ceil()
        .max(0.0);
    let px = |i: usize| l + (w - l - r) * i as f64 / (n - 1.0);
    let py = |y: f64| t + (h - t - b) * (hi - y) / (hi - lo).max(1e-9);
    let mut s = format!(
        "<svg viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"log10 rel_l2 along graph depth\">"
    );
    // Grid and y labels.
    let mut y = lo;
    while y <= hi {
        let _ = write!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">1e{}</text>",
            w - r,
            py(y),
            py(y),
            l - 6.0,
            py(y) + 4.0,
            y as i64
        );
        y += 2.0;
    }
    // Step boundaries.
    let mut last_step = None;
    let mut labels = 0usize;
    let steps = e.error_profile.by_step.len().max(1);
    let every = steps.div_ceil(12).max(1);
    for (i, c) in e.checkpoints.iter().enumerate() {
        if last_step != Some(c.step) {
            last_step = Some(c.step);
            let x = px(i);
            let _ = write!(
                s,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{t}\" y2=\"{}\" stroke=\"#ccc\" stroke-dasharray=\"3,3\"/>",
                h - b
            );
            if labels.is_multiple_of(every) {
                let _ = write!(
                    s,
                    "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" fill=\"#555\">step {}</text>",
                    x + 2.0,
                    h - b + 14.0,
                    c.step
                );
            }
            labels += 1;
        }
    }
    // Line through measured points.
    let pts: Vec<String> = ys
        .iter()
        .enumerate()
        .filter_map(|(i, y)| y.map(|y| format!("{:.1},{:.1}", px(i), py(y))))
        .collect();
    if pts.len() > 1 {
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"#90a4ae\" stroke-width=\"1\" points=\"{}\"/>",
            pts.join(" ")
        );
    }
    for (i, (c, y)) in e.checkpoints.iter().zip(&ys).enumerate() {
        let (cy, rl) = match y {
            Some(y) => (py(*y), c.metrics.as_ref().map_or(0.0, |m| m.rel_l2)),
            None => (h - b, 0.0),
        };
        let rad = if c.status == Status::Origin { 5.0 } else { 2.5 };
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{cy:.1}\" r=\"{rad}\" fill=\"{}\"><title>{} ({}) rel_l2 {}</title></circle>",
            px(i),
            status_colour(c.status),
            esc_html(&c.id()),
            c.status.as_str(),
            num(rl)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#555\" text-anchor=\"end\">graph depth (topological order) →</text></svg>",
        w - r,
        h - 4.0
    );
    s
}

/// Why a verdict other than pass has no first divergence.
fn not_localized(e: &Evidence) -> &'static str {
    if e.unaccounted_local_errors() > 0 {
        "No checkpoint fails; ops make errors of their own beyond f32 bounds that no declared precision accounts for (the local errors above)."
    } else {
        "Not localized: no failing checkpoint has all its inputs passing (see missing or alignment-fault checkpoints)."
    }
}

/// The self-contained HTML report.
pub fn html(e: &Evidence) -> String {
    let verdict = e.effective_verdict();
    let mut s = String::with_capacity(4096 + 400 * e.checkpoints.len());
    let _ = write!(
        s,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>X-Ray: {} — {}</title><style>{CSS}</style></head><body>",
        verdict.as_str(),
        esc_html(&e.run.family)
    );
    let _ = write!(
        s,
        "<div class=\"banner {}\">X-Ray verdict: {}<small>{} · {} · runtime {} · oracle {} · {}</small></div><main>",
        verdict.as_str(),
        verdict.as_str().to_uppercase(),
        esc_html(&e.run.family),
        esc_html(&e.run.model_path),
        esc_html(&e.run.runtime_version),
        esc_html(&oracle_line(e)),
        esc_html(&format!("{} checkpoints: {}", e.checkpoints.len(), status_counts(e)))
    );
    let partial = partial_lines(e);
    if !partial.is_empty() {
        s.push_str("<section class=\"box\"><h2>Coverage, isolation, tokens</h2><ul>");
        for l in &partial {
            let _ = write!(s, "<li>{}</li>", esc_html(l));
        }
        s.push_str("</ul></section>");
    }
    if let Some(fd) = &e.first_divergence {
        let _ = write!(s, "<section class=\"box origin\"><h2>First divergence: <code>{}</code></h2><p>Produced by <code>{}</code>. Its inputs:</p><table><tr><th>input</th><th>status</th></tr>", xray_core::key(&esc_html(&fd.checkpoint), fd.step), esc_html(&fd.producer));
        for i in &fd.inputs {
            let _ = write!(
                s,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                xray_core::key(&esc_html(&i.checkpoint), i.step),
                status_chip(i.status)
            );
        }
        if fd.inputs.is_empty() {
            s.push_str("<tr><td colspan=\"2\">(no captured inputs: a graph source)</td></tr>");
        }
        s.push_str("</table>");
        if let Some(x) = &fd.explanation {
            let ev = serde_json::to_string_pretty(&x.evidence).unwrap_or_default();
            let _ = write!(
                s,
                "<p><b>Signature <code>{}</code></b>: {}</p><details><summary>evidence</summary><pre>{}</pre></details>",
                esc_html(x.signature.as_str()),
                esc_html(&x.detail),
                esc_html(&ev)
            );
        }
        if let Some(op) = &fd.op {
            op_origin_html(&mut s, op);
        }
        s.push_str("</section>");
    } else if verdict != Verdict::Pass {
        let _ = write!(
            s,
            "<section class=\"box origin\"><h2>First divergence: not localized</h2><p>{}</p></section>",
            esc_html(not_localized(e))
        );
    }
    if let Some(d) = &e.drill_down {
        let _ = write!(
            s,
            "<section class=\"box\"><h2>Token drill-down</h2><p>First divergent token at step {}: {}.</p></section>",
            d.token_step,
            drill_down_checkpoints(d, |x| format!("<code>{}</code>", esc_html(x)))
        );
    }
    if e.transcript.is_some() || e.capture_neutral.is_some() {
        s.push_str("<section class=\"box\"><h2>Transcript</h2>");
        if let Some(t) = &e.transcript {
            let _ = write!(
                s,
                "<p>reference: “{}”<br>runtime: “{}”<br>tokens equal: <b>{}</b>{}</p>",
                esc_html(&t.reference),
                esc_html(&t.runtime),
                if t.tokens_equal { "yes" } else { "no" },
                t.first_divergent_step
                    .map(|k| format!(" (first divergent step {k})"))
                    .unwrap_or_default()
            );
        }
        if let Some(c) = e.capture_neutral {
            let _ = write!(
                s,
                "<p>Capture neutral: <b>{}</b></p>",
                capture_neutral(c, "no: capture changed the outputs")
            );
        }
        s.push_str("</section>");
    }
    let _ = write!(
        s,
        "<section class=\"box\"><h2>Error along graph depth (log10 rel_l2)</h2>{}<p class=\"legend\">",
        svg_plot(e)
    );
    for st in PLOTTED {
        let _ = write!(s, "<span>{}</span>", status_chip(*st));
    }
    s.push_str("</p></section>");
    if !e.error_profile.by_step.is_empty() {
        s.push_str("<section class=\"box\"><details><summary><b>Error by step and layer</b></summary><table><tr><th>step</th><th>max rel_l2</th><th>max max_abs</th><th>worst checkpoint</th><th>divergent</th></tr>");
        for p in &e.error_profile.by_step {
            let _ = write!(
                s,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td class=\"n\">{}</td></tr>",
                p.step,
                num(p.max_rel_l2),
                num(p.max_abs),
                esc_html(&p.worst_checkpoint),
                p.divergent
            );
        }
        s.push_str("</table><table><tr><th>stack</th><th>layer</th><th>step</th><th>max rel_l2</th><th>max max_abs</th><th>worst checkpoint</th></tr>");
        for p in &e.error_profile.by_layer {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td></tr>",
                esc_html(&p.stack),
                p.layer,
                p.step,
                num(p.max_rel_l2),
                num(p.max_abs),
                esc_html(&p.worst_checkpoint)
            );
        }
        s.push_str("</table></details></section>");
    }
    let local = e.checkpoints.iter().any(|c| c.local_metrics.is_some());
    let _ = write!(
        s,
        "<section class=\"box\"><h2>Checkpoints</h2><div class=\"scroll\"><table><tr><th>#</th><th>checkpoint</th><th>step</th><th>producer</th><th>status</th><th>shape</th><th>max_abs</th><th>rel_l2</th>{}<th>cosine</th><th>max_ulp</th><th>outliers</th><th>worst element</th><th>tolerance</th></tr>",
        if local { "<th>local rel_l2</th>" } else { "" }
    );
    for (i, c) in e.checkpoints.iter().enumerate() {
        let cls = if c.status == Status::Origin {
            " class=\"origin\""
        } else {
            ""
        };
        let _ = write!(
            s,
            "<tr{cls}><td class=\"n\">{i}</td><td><code>{}</code></td><td class=\"n\">{}</td><td><code>{}</code></td><td>{}</td><td>{:?}</td>",
            esc_html(&c.name),
            c.step,
            esc_html(&c.producer),
            status_chip(c.status),
            c.shape
        );
        match &c.metrics {
            Some(m) => {
                let _ = write!(
                    s,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td>",
                    num(m.max_abs),
                    num(m.rel_l2)
                );
                if local {
                    let lr = c
                        .local_metrics
                        .as_ref()
                        .map_or("-".into(), |l| num(l.rel_l2));
                    let _ = write!(s, "<td class=\"n\">{lr}</td>");
                }
                let worst = m.worst.as_ref().map_or(String::from("-"), |w| {
                    format!("{:?}: {} vs {}", w.index, w.reference, w.runtime)
                });
                let _ = write!(
                    s,
                    "<td class=\"n\">{:.6}</td><td class=\"n\">{}</td><td class=\"n\">{:.3}%</td><td>{}</td>",
                    m.cosine,
                    m.max_ulp,
                    100.0 * m.beyond_fraction,
                    esc_html(&worst)
                );
            }
            None => {
                let cols = if local { 7 } else { 6 };
                let _ = write!(
                    s,
                    "<td colspan=\"{cols}\">{}</td>",
                    esc_html(c.note.as_deref().unwrap_or("no metrics"))
                );
            }
        }
        let _ = write!(s, "<td>{}</td></tr>", esc_html(&c.tolerance.source));
    }
    s.push_str("</table></div></section>");
    if !e.notes.is_empty() {
        s.push_str("<section class=\"box\"><h2>Notes</h2><ul>");
        for n in &e.notes {
            let _ = write!(s, "<li>{}</li>", esc_html(n));
        }
        s.push_str("</ul></section>");
    }
    s.push_str("</main></body></html>\n");
    s
}

/// The op-level origin inside the first-divergence panel: the point and op, its mechanism, and
/// the replayed local errors (the engine's output against the reference module re-run on the
/// engine's own input).
/// A replay verdict as the reports write it.
fn verdict_word(v: crate::mechanism::ReplayVerdict) -> &'static str {
    match v {
        crate::mechanism::ReplayVerdict::Cleared => "cleared",
        crate::mechanism::ReplayVerdict::Convicted => "convicted",
    }
}

fn op_origin_html(s: &mut String, op: &crate::ops::OpDivergence) {
    let who = match &op.op {
        Some(o) => format!("op <code>{}</code>", esc_html(o)),
        None => format!("one of <code>{}</code>", esc_html(&op.suspects.join(", "))),
    };
    let _ = write!(s, "<h3>Op-level origin: <code>{}</code></h3><p>{who}, module <code>{}</code>; upstream points: {}.</p>", xray_core::key(&esc_html(&op.point), op.step), esc_html(&op.module), op.inputs
            .iter()
            .map(|i| format!("<code>{}</code> {}", esc_html(&i.point), status_chip(i.status)))
            .collect::<Vec<_>>()
            .join(", "));
    if let Some(x) = &op.explanation {
        let _ = write!(
            s,
            "<p>Tensor pattern <code>{}</code>: {}</p>",
            esc_html(x.signature.as_str()),
            esc_html(&x.detail)
        );
    }
    let Some(r) = &op.replay else {
        s.push_str("<p>No reference replay (it needs the oracle: <code>xray check</code>, or <code>xray compare --model DIR</code> built with it).</p>");
        return;
    };
    match &r.mechanism {
        Some(m) => {
            let _ = write!(
                s,
                "<p><b>Mechanism</b>: {} (clean replay's residual {}).</p>",
                esc_html(&m.summary),
                m.clean_residual.map_or("-".into(), |c| format!("{c:.2e}"))
            );
        }
        None => {
            let _ = write!(
                s,
                "<p><b>Mechanism</b>: none of the {} counterfactuals tried reproduces the engine's output.</p>",
                r.tried.len()
            );
        }
    }
    s.push_str("<div class=\"wide\"><table><tr><th>replayed op</th><th>engine input</th><th>local error rel_l2</th><th>max abs</th><th>verdict</th></tr>");
    for le in std::iter::once(&r.local_error).chain(&r.neighbours) {
        let _ = write!(
            s,
            "<tr><td><code>{}</code>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc_html(&le.module),
            le.op
                .as_ref()
                .map_or(String::new(), |o| format!(" (<code>{}</code>)", esc_html(o))),
            esc_html(&le.inputs.join(", ")),
            le.rel_l2.map_or("-".into(), |v| format!("{v:.2e}")),
            le.max_abs.map_or("-".into(), |v| format!("{v:.2e}")),
            verdict_word(le.verdict)
        );
    }
    s.push_str("</table></div>");
    if !r.tried.is_empty() {
        s.push_str("<details><summary>counterfactuals tried</summary><table><tr><th>hypothesis</th><th>residual</th></tr>");
        for t in &r.tried {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td></tr>",
                esc_html(&t.counterfactual.phrase()),
                t.residual.map_or_else(
                    || esc_html(t.skipped.as_deref().unwrap_or("-")),
                    |v| format!("{v:.2e}")
                )
            );
        }
        s.push_str("</table></details>");
    }
}

/// Names the checkpoints that could not be compared (missing or not aligned), at most 12 of each
/// kind, or `None` when every checkpoint was compared.
pub fn not_compared(e: &Evidence) -> Option<String> {
    use crate::localize::Status;
    let mut parts = Vec::new();
    for (status, label) in [
        (Status::Missing, "missing"),
        (Status::AlignmentFault, "not aligned"),
    ] {
        let ids: Vec<String> = e
            .checkpoints
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.id())
            .collect();
        if ids.is_empty() {
            continue;
        }
        let mut t = format!(
            "{} {label}: {}",
            ids.len(),
            ids[..ids.len().min(12)].join(", ")
        );
        if ids.len() > 12 {
            t.push_str(&format!(", and {} more", ids.len() - 12));
        }
        parts.push(t);
    }
    (!parts.is_empty()).then(|| format!("not compared: {}", parts.join("; ")))
}

/// One-paragraph human summary of an evidence document: what `xray check` and `xray compare`
/// print on stderr, its first line `xray: verdict ...`.
pub fn summary(e: &Evidence) -> String {
    let n = e.checkpoints.len();
    let pass = e
        .checkpoints
        .iter()
        .filter(|c| c.status == crate::localize::Status::Pass)
        .count();
    let observed = e
        .checkpoints
        .iter()
        .filter(|c| c.status.is_observed())
        .count();
    let mut s = if observed == n {
        format!(
            "xray: verdict {} ({pass}/{n} checkpoints pass",
            e.verdict.as_str()
        )
    } else {
        format!(
            "xray: verdict {} ({pass}/{observed} observed checkpoints pass, {n} in the contract",
            e.verdict.as_str()
        )
    };
    if let Some(c) = e.capture_neutral {
        s.push_str(&format!(", capture neutral: {c}"));
    }
    s.push(')');
    if let Some(c) = e
        .coverage
        .as_ref()
        .filter(|c| c.unobserved + c.not_comparable > 0)
    {
        s.push_str(&format!(
            "\nxray: coverage: {} observed, {} unobserved, {} not comparable",
            c.observed, c.unobserved, c.not_comparable,
        ));
        if !c.unobserved_names.is_empty() {
            s.push_str(&format!("; unobserved: {}", c.unobserved_names.join(", ")));
        }
    }
    for f in &e.fed {
        s.push_str(&format!(
            "\nxray: fed with the reference's tensor: {} ({})",
            f.checkpoint, f.dump
        ));
    }
    if let Some(t) = &e.tokens {
        if let Some(k) = t.parted_at_step {
            let who = if t.teacher_forced {
                "own argmax"
            } else {
                "runtime"
            };
            let tail = not_comparable_tail(t);
            s.push_str(&match (t.reference_token, t.candidate_token) {
                (None, Some(c)) => format!(
                    "\nxray: tokens part at step {k}: the reference's tokens end there ({who} {c} goes on): a reference dump with fewer steps, or truncated{tail}"
                ),
                (Some(r), None) => format!(
                    "\nxray: tokens part at step {k}: the {who}'s tokens end there (reference {r} goes on){tail}"
                ),
                (r, c) => format!(
                    "\nxray: tokens part at step {k} (reference {}, {who} {}){tail}",
                    r.map_or("-".into(), |x| x.to_string()),
                    c.map_or("-".into(), |x| x.to_string()),
                ),
            });
        }
    }
    if let Some(t) = &e.transcript {
        s.push_str(&format!(
            "\nxray: reference: {:?}\nxray: runtime:   {:?} (tokens equal: {})",
            t.reference, t.runtime, t.tokens_equal
        ));
    }
    if let Some(n) = not_compared(e) {
        s.push_str(&format!("\nxray: {n}"));
    }
    if let Some(p) = &e.op_points {
        s.push_str(&format!("\nxray: {}", p.summary()));
    }
    if let Some(l) = &e.local_errors {
        s.push_str(&format!("\nxray: {}", l.summary()));
    }
    let mut printed: Vec<&Vec<String>> = Vec::new();
    if let Some(f) = &e.first_divergence {
        let head = first_divergence_head(f, |x| format!(": {}", x.detail));
        s.push_str(&format!("\nxray: {head}"));
        if let Some(r) = &f.region {
            s.push_str(&format!(
                "\nxray: unobserved region {}: {}",
                r.summary,
                r.unobserved.join(", ")
            ));
        }
        if f.suspects.len() > 1 {
            s.push_str(&format!("\nxray: suspects: {}", f.suspects.join(", ")));
            printed.push(&f.suspects);
        }
        if let Some(op) = &f.op {
            s.push_str(&format!("\nxray: op-level origin: {}", op.summary()));
            if let Some(r) = &op.replay {
                s.push_str(&format!("\nxray: {}", r.summary()));
            }
        }
    }
    // Consecutive independent divergences of one checkpoint with the same signature and
    // suspects are one finding over several steps: the first is printed, the rest named.
    let mut i = 0;
    while i < e.independent.len() {
        let f = &e.independent[i];
        let sig =
            |x: &crate::evidence::FirstDivergence| x.explanation.as_ref().map(|x| x.signature);
        let mut j = i + 1;
        while j < e.independent.len()
            && e.independent[j].checkpoint == f.checkpoint
            && sig(&e.independent[j]) == sig(f)
            && e.independent[j].suspects == f.suspects
        {
            j += 1;
        }
        let same = &e.independent[i + 1..j];
        i = j;
        s.push_str(&format!(
            "\nxray: independent divergence: {}",
            xray_core::key(&f.checkpoint, f.step)
        ));
        if let Some(x) = &f.explanation {
            s.push_str(&format!(": {}", x.detail));
        }
        if let Some(r) = &f.region {
            s.push_str(&format!("\nxray:   unobserved region {}", r.summary));
        }
        if f.suspects.len() > 1 {
            // Each list once: independent divergences behind one region share it.
            if printed.contains(&&f.suspects) {
                s.push_str(&format!(
                    "\nxray:   suspects: the same {} as above",
                    f.suspects.len()
                ));
            } else {
                s.push_str(&format!("\nxray:   suspects: {}", f.suspects.join(", ")));
                printed.push(&f.suspects);
            }
        }
        if !same.is_empty() {
            let steps: Vec<Step> = same.iter().map(|x| x.step).collect();
            s.push_str(&format!("\nxray: independent divergence: {} likewise (signature {}, the same suspects; each in the evidence)", xray_core::key_steps(&f.checkpoint, &crate::evidence::int_ranges(&steps)), sig(f).map_or("-", |k| k.as_str())));
        }
    }
    s
}

/// One line for a test failure or a CI log: the first line of [`summary`] (the verdict and the
/// checkpoint counts) and, when there is one, the first divergence: checkpoint, step, producer,
/// signature and the op-level origin's op. What the pytest plugin fails a test with.
pub fn headline(e: &Evidence) -> String {
    let s = summary(e);
    let mut line = s.lines().next().unwrap_or_default().to_string();
    if let Some(f) = &e.first_divergence {
        let head = first_divergence_head(f, |x| format!(", signature {}", x.signature));
        line.push_str(&format!("; {head}"));
        if let Some(op) = &f.op {
            line.push_str(&format!(
                ", op-level origin {}",
                op.op.as_deref().unwrap_or(&op.point)
            ));
        }
    }
    if !e.independent.is_empty() {
        line.push_str(&format!(
            "; {} independent divergence(s)",
            e.independent.len()
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            esc_html("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(esc_md("a|b`c\nd_e"), "a\\|b\\`c d\\_e");
    }

    /// What a CommonMark reader sees outside code spans (backslash escapes and code spans per
    /// the spec: a run of N backticks opens, the next run of exactly N closes, else it is text).
    fn outside_code_spans(line: &str) -> String {
        let c: Vec<char> = line.chars().collect();
        let (mut i, mut out) = (0, String::new());
        while i < c.len() {
            if c[i] == '\\' && i + 1 < c.len() && c[i + 1].is_ascii_punctuation() {
                // An escaped character is text: kept as a placeholder.
                out.push('.');
                i += 2;
                continue;
            }
            if c[i] == '`' {
                let n = c[i..].iter().take_while(|&&x| x == '`').count();
                let mut j = i + n;
                let mut close = None;
                while j < c.len() {
                    if c[j] == '`' {
                        let m = c[j..].iter().take_while(|&&x| x == '`').count();
                        if m == n {
                            close = Some(j);
                            break;
                        }
                        j += m;
                    } else {
                        j += 1;
                    }
                }
                match close {
                    Some(j) => i = j + n,
                    None => {
                        out.extend(std::iter::repeat_n('`', n));
                        i += n;
                    }
                }
                continue;
            }
            out.push(c[i]);
            i += 1;
        }
        out
    }

    /// Issue 24 item 11: a checkpoint name, producer, signature, note or model path holding
    /// backticks, pipes and HTML cannot leave raw HTML or a link in the PR comment, nor break a
    /// table row.
    #[test]
    fn hostile_strings_stay_text_in_markdown() {
        use crate::evidence::{FirstDivergence, InputEvidence};
        use crate::localize::{ErrorProfile, StepProfile};
        let evil = "x`<img src=x onerror=alert(1)>`[a](javascript:alert(1))``|`";
        let mut e = crate::evidence::tests::tiny();
        e.run.model_path = evil.into();
        e.run.runtime_version = evil.into();
        e.run.family = evil.into();
        let mut c = crate::evidence::tests::checkpoint(evil, Status::Origin);
        c.producer = evil.into();
        c.tolerance.source = evil.into();
        e.checkpoints = vec![c];
        e.verdict = Verdict::Diverged;
        e.first_divergence = Some(FirstDivergence {
            checkpoint: evil.into(),
            step: 0,
            producer: evil.into(),
            inputs: vec![InputEvidence {
                checkpoint: evil.into(),
                step: 0,
                status: Status::Pass,
            }],
            explanation: Some(crate::signatures::Explanation {
                signature: xray_core::SignatureKind::None,
                detail: evil.into(),
                evidence: serde_json::json!({}),
            }),
            kind: Default::default(),
            region: None,
            suspects: vec![],
            op: None,
        });
        e.error_profile = ErrorProfile {
            by_layer: vec![],
            by_step: vec![StepProfile {
                step: 0,
                max_rel_l2: 1.0,
                max_abs: 1.0,
                worst_checkpoint: evil.into(),
                divergent: 1,
            }],
        };
        e.notes = vec![evil.into()];
        let md = markdown(&e);
        for line in md.lines() {
            let text = outside_code_spans(line);
            // Raw HTML, a link or an image: none outside a code span (escaped `\[`, `\]` and
            // `&lt;` are text).
            for bad in ["<", "](", "!["] {
                assert!(!text.contains(bad), "{bad:?} outside a code span: {line}");
            }
            // Table rows keep their columns: every unescaped pipe (GFM splits on those, inside
            // code spans too) is a cell border.
            if line.starts_with('|') {
                let pipes = line.len() - line.replace('|', "").len();
                let escaped = line.matches("\\|").count();
                let header = md
                    .lines()
                    .rev()
                    .skip_while(|l| *l != line)
                    .take_while(|l| l.starts_with('|'))
                    .last()
                    .unwrap();
                assert_eq!(
                    pipes - escaped,
                    header.matches('|').count(),
                    "row split differently from its header: {line}"
                );
            }
        }
        assert_eq!(
            md_code("a``b", false),
            "```a``b```",
            "fence longer than any run"
        );
        assert_eq!(md_code("`x", false), "`` `x ``");
        assert_eq!(md_code("a|b", true), "`a\\|b`");
    }

    #[test]
    fn numbers() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(f64::MAX), "inf");
        assert_eq!(num(1.23456e-5), "1.23e-5");
    }

    #[test]
    fn partial_coverage_is_rendered() {
        use crate::evidence::{Coverage, FirstDivergence, Region, TokenAlignment};
        let mut e = crate::evidence::tests::tiny();
        e.verdict = Verdict::Diverged;
        e.coverage = Some(Coverage {
            observed: 12,
            unobserved: 40,
            not_comparable: 6,
            unobserved_names: vec!["audio.encoder.layer.0..3.out".into()],
        });
        e.tokens = Some(TokenAlignment {
            teacher_forced: false,
            prefix: 2,
            parted_at_step: Some(3),
            reference_token: Some(7),
            candidate_token: Some(9),
            not_comparable_steps: Some("4..9".into()),
        });
        e.first_divergence = Some(FirstDivergence {
            checkpoint: "audio.encoder.memory".into(),
            step: 0,
            producer: "encoder.final_norm".into(),
            inputs: vec![],
            explanation: None,
            kind: Default::default(),
            region: Some(Region {
                summary: "between audio.frontend.mel@0 (pass) and audio.encoder.memory@0 (fail)"
                    .into(),
                after: vec![],
                unobserved: vec!["audio.encoder.layer.0..3.out".into()],
                unobserved_count: 6,
            }),
            suspects: vec!["encoder.conv1".into(), "encoder.final_norm".into()],
            op: None,
        });
        let (md, h) = (markdown(&e), html(&e));
        for needle in [
            "12 observed, 40 unobserved, 6 not comparable",
            "part at step 3",
            "steps 4..9 not comparable",
            "between audio.frontend.mel@0 (pass) and audio.encoder.memory@0 (fail)",
            "Suspects: encoder.conv1, encoder.final",
        ] {
            assert!(h.contains(needle), "html lacks {needle}");
            assert!(
                md.replace('\\', "").contains(needle),
                "markdown lacks {needle}"
            );
        }
    }
}
