//! Mixed precision without a second copy of every kernel: the f16-storage twin of a family's WGSL
//! is generated from its f32 source, so the two can never drift apart.
//!
//! The transform is a small scanner over WGSL tokens, not a compiler: it rewrites the accesses
//! to the module's storage tensors and copies every other byte, comments included, as it was.
//! What it does not understand it refuses with the file and line, so that a new shader pattern
//! fails in the tests below rather than producing wrong code.

use std::collections::{HashMap, HashSet};

/// The f16-storage twin of a family's f32 WGSL: the same kernels, with every module-scope
/// storage tensor (`var<storage, ..> NAME: array<f32>` or `array<vec4<f32>>`) stored as f16 but
/// all arithmetic still in f32. Each load `NAME[i]` widens to f32 (`f32(NAME[i])`,
/// `vec4<f32>(NAME[i])`), each store `NAME[i] = E` (or `NAME[i].x = E`, or `NAME[i] op= E`)
/// narrows to f16 once, at the store. Why: f16 storage halves the memory traffic that sets the
/// pace of most kernels, while accumulating in f32 registers and workgroup memory keeps sums
/// over thousands of terms as exact as the f32 kernels'. Storage arrays of other element types,
/// uniform windows, workgroup tiles and locals keep their types; `enable f16;` goes first, as
/// WGSL requires.
///
/// `file` names the source in errors. `Err` says where the source uses a storage tensor in a way
/// the transform does not know (anything but `NAME[..]` and `arrayLength(&NAME)`), or where its
/// brackets do not balance.
///
/// The tensors named in `keep` stay f32: the outputs of reductions, whose partial sums would
/// lose precision if stored in f16 between passes (the caller binds f32 tensors there).
pub(crate) fn f16_source(
    file: &str,
    source: &str,
    keep: &[&str],
) -> std::result::Result<String, String> {
    let toks = lex(source);
    let Some((first, last)) = toks.first().zip(toks.last()) else {
        return Ok(format!("enable f16;\n{source}"));
    };
    let (arrays, retype) = storage_tensors(source, &toks, keep);
    let mut rewriter = Rewriter {
        file,
        src: source,
        toks: &toks,
        arrays,
        retype,
        shadows: Vec::new(),
        pending: Vec::new(),
        depth: 0,
    };
    let body = rewriter.walk(0, toks.len())?;
    Ok(format!(
        "enable f16;\n{}{body}{}",
        &source[..first.start],
        &source[last.end..]
    ))
}

/// A storage tensor's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    Scalar,
    Vec4,
}

impl Elem {
    fn widen(self, access: &str) -> String {
        match self {
            Elem::Scalar => format!("f32({access})"),
            Elem::Vec4 => format!("vec4<f32>({access})"),
        }
    }

    fn narrow(self, value: &str) -> String {
        match self {
            Elem::Scalar => format!("f16({value})"),
            Elem::Vec4 => format!("vec4<f16>({value})"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    Number,
    Punct,
}

/// A token: its kind and byte range. Whitespace and comments are not tokens; they are copied
/// from the gaps between tokens, so the transform never looks inside a comment.
#[derive(Clone, Copy, Debug)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
}

fn lex(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    // Non-ASCII bytes outside comments can only belong to identifiers; keeping them in one token
    // keeps every token boundary on a character boundary.
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            // WGSL block comments nest.
            let mut open = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    open += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    open -= 1;
                    i += 2;
                    if open == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            // Whole literals (`0x1f`, `1.5e3f`), so their letters are never taken for names.
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
            toks.push(Tok {
                kind: Kind::Number,
                start,
                end: i,
            });
        } else if ident(c) {
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            toks.push(Tok {
                kind: Kind::Ident,
                start,
                end: i,
            });
        } else {
            i += 1;
            toks.push(Tok {
                kind: Kind::Punct,
                start,
                end: i,
            });
        }
    }
    toks
}

/// The module-scope `var<storage, ..>` arrays of f32 or vec4<f32>, and the indices of the `f32`
/// tokens in their declarations (to become `f16`). Declarations may follow their uses in WGSL,
/// hence a pass of its own.
fn storage_tensors<'a>(
    src: &'a str,
    toks: &[Tok],
    keep: &[&str],
) -> (HashMap<&'a str, Elem>, HashSet<usize>) {
    let text = |k: usize| toks.get(k).map_or("", |t| &src[t.start..t.end]);
    let mut arrays = HashMap::new();
    let mut retype = HashSet::new();
    let mut depth = 0usize;
    for k in 0..toks.len() {
        match text(k) {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "var" if depth == 0 && text(k + 1) == "<" && text(k + 2) == "storage" => {
                let Some(close) = (k + 2..toks.len()).find(|&j| text(j) == ">") else {
                    continue;
                };
                let name = text(close + 1);
                if text(close + 2) != ":" || keep.contains(&name) {
                    continue;
                }
                let ty_start = close + 3;
                let ty_end = (ty_start..toks.len())
                    .find(|&j| text(j) == ";")
                    .unwrap_or(toks.len());
                let ty: String = (ty_start..ty_end).map(text).collect();
                let elem = match ty.as_str() {
                    "array<f32>" => Elem::Scalar,
                    "array<vec4<f32>>" => Elem::Vec4,
                    _ => continue,
                };
                arrays.insert(name, elem);
                retype.extend((ty_start..ty_end).filter(|&j| text(j) == "f32"));
            }
            _ => {}
        }
    }
    (arrays, retype)
}

struct Rewriter<'a> {
    file: &'a str,
    src: &'a str,
    toks: &'a [Tok],
    /// The storage tensors to convert.
    arrays: HashMap<&'a str, Elem>,
    /// Token indices of the `f32` in their declarations.
    retype: HashSet<usize>,
    /// Locals and parameters named like a tensor, which hide it: the name, and the brace depth
    /// below which its scope has ended.
    shadows: Vec<(&'a str, usize)>,
    /// Locals declared but not yet in scope: their own initializer still sees the tensor.
    pending: Vec<(&'a str, usize)>,
    /// Brace depth at the current token.
    depth: usize,
}

impl<'a> Rewriter<'a> {
    fn text(&self, k: usize) -> &'a str {
        self.toks.get(k).map_or("", |t| &self.src[t.start..t.end])
    }

    /// The whitespace and comments before token `k`.
    fn gap(&self, k: usize) -> &'a str {
        let end = self.toks[k].start;
        let start = if k == 0 { 0 } else { self.toks[k - 1].end };
        &self.src[start..end]
    }

    /// The source of tokens `lo..hi`, as it is.
    fn span(&self, lo: usize, hi: usize) -> &'a str {
        &self.src[self.toks[lo].start..self.toks[hi - 1].end]
    }

    fn line(&self, k: usize) -> usize {
        self.src[..self.toks[k].start].matches('\n').count() + 1
    }

    fn error(&self, k: usize, what: &str) -> String {
        format!(
            "{}:{}: {what} (the f16 transform knows NAME[..] and arrayLength(&NAME) only)",
            self.file,
            self.line(k)
        )
    }

    /// Whether token `k` names a storage tensor, not a local that hides it, a member or an
    /// attribute.
    fn is_tensor(&self, k: usize) -> bool {
        let name = self.text(k);
        self.toks[k].kind == Kind::Ident
            && self.arrays.contains_key(name)
            && !self.shadows.iter().any(|&(s, _)| s == name)
            && !(k > 0 && matches!(self.text(k - 1), "." | "@"))
    }

    /// The index of the bracket closing the one at `open`.
    fn closing(&self, open: usize) -> std::result::Result<usize, String> {
        let (o, c) = match self.text(open) {
            "[" => ("[", "]"),
            "(" => ("(", ")"),
            "<" => ("<", ">"),
            _ => ("{", "}"),
        };
        let mut depth = 0usize;
        for j in open..self.toks.len() {
            let t = self.text(j);
            if t == o {
                depth += 1;
            } else if t == c {
                depth -= 1;
                if depth == 0 {
                    return Ok(j);
                }
            }
        }
        Err(self.error(open, &format!("unclosed {o}")))
    }

    /// The end of the expression starting at `start`: the `;` after it, or the bracket that
    /// closes around it (a `for` update).
    fn expr_end(&self, start: usize) -> std::result::Result<usize, String> {
        let mut depth = 0usize;
        for j in start..self.toks.len() {
            match self.text(j) {
                "(" | "[" => depth += 1,
                ")" | "]" | "}" if depth == 0 => return Ok(j),
                ")" | "]" => depth -= 1,
                ";" if depth == 0 => return Ok(j),
                _ => {}
            }
        }
        Err(self.error(start, "a store without an end"))
    }

    /// Tokens `lo..hi` rewritten, from the start of the first to the end of the last.
    fn walk(&mut self, lo: usize, hi: usize) -> std::result::Result<String, String> {
        let mut out = String::new();
        let mut k = lo;
        while k < hi {
            if k > lo {
                out.push_str(self.gap(k));
            }
            k = self.token(k, &mut out)?;
        }
        Ok(out)
    }

    /// Rewrites token `k` (and those that belong to it) into `out`; returns the next token.
    fn token(&mut self, k: usize, out: &mut String) -> std::result::Result<usize, String> {
        let t = self.text(k);
        match t {
            "{" => self.depth += 1,
            "}" => {
                self.depth = self.depth.saturating_sub(1);
                let depth = self.depth;
                self.shadows.retain(|&(_, d)| d <= depth);
            }
            ";" => self.shadows.append(&mut self.pending),
            // Member names are not uses of a tensor.
            "struct" if self.depth == 0 => {
                let open = (k..self.toks.len())
                    .find(|&j| self.text(j) == "{")
                    .ok_or_else(|| self.error(k, "a struct without a body"))?;
                let close = self.closing(open)?;
                out.push_str(self.span(k, close + 1));
                return Ok(close + 1);
            }
            "fn" => self.parameters(k)?,
            "let" | "var" | "const" | "override" => return self.declaration(k, out),
            _ if self.is_tensor(k) => return self.access(k, out),
            _ if self.retype.contains(&k) => {
                out.push_str("f16");
                return Ok(k + 1);
            }
            _ => {}
        }
        out.push_str(t);
        Ok(k + 1)
    }

    /// A function's parameters named like a tensor hide it in the body.
    fn parameters(&mut self, k: usize) -> std::result::Result<(), String> {
        let open = k + 2;
        if self.text(open) != "(" {
            return Err(self.error(k, "a function without parameters"));
        }
        let close = self.closing(open)?;
        for j in open + 1..close {
            let name = self.text(j);
            if self.text(j + 1) == ":" && self.arrays.contains_key(name) {
                self.shadows.push((name, self.depth + 1));
            }
        }
        Ok(())
    }

    /// `let`, `var`, `const` or `override` at `k`: copies it and its name, and makes a local
    /// named like a tensor hide it, from the end of the declaration to the end of its block.
    fn declaration(&mut self, k: usize, out: &mut String) -> std::result::Result<usize, String> {
        let mut name = k + 1;
        if self.text(name) == "<" {
            name = self.closing(name)? + 1;
        }
        out.push_str(self.span(k, name + 1));
        let text = self.text(name);
        if self.depth > 0 && self.arrays.contains_key(text) {
            // A `for` initializer lives as long as the loop's body, one brace deeper.
            let in_for = k >= 2 && self.text(k - 1) == "(" && self.text(k - 2) == "for";
            let depth = self.depth + usize::from(in_for);
            self.pending.push((text, depth));
        }
        Ok(name + 1)
    }

    /// A use of the tensor named by token `k`: a load, a store or a compound store.
    fn access(&mut self, k: usize, out: &mut String) -> std::result::Result<usize, String> {
        let name = self.text(k);
        let elem = self.arrays[name];
        let by_address = k > 0 && self.text(k - 1) == "&";
        if self.text(k + 1) != "[" {
            let length = by_address
                && k >= 3
                && self.text(k - 2) == "("
                && self.text(k - 3) == "arrayLength"
                && self.text(k + 1) == ")";
            if length {
                out.push_str(name);
                return Ok(k + 1);
            }
            return Err(self.error(k, &format!("{name} is used but not indexed")));
        }
        if by_address {
            return Err(self.error(k, &format!("a pointer into {name}")));
        }
        let close = self.closing(k + 1)?;
        if close == k + 2 {
            return Err(self.error(k, &format!("{name}[] without an index")));
        }
        let index = self.walk(k + 2, close)?;
        let access = format!(
            "{name}{}[{}{index}{}]",
            self.gap(k + 1),
            self.gap(k + 2),
            self.gap(close)
        );
        // A component (`.x`, `.xy`, `[2]`): loads and stores go through the whole vector.
        let mut next = close + 1;
        let mut component = String::new();
        let mut elem_of_store = elem;
        if self.text(next) == "." && self.toks.get(next + 1).map(|t| t.kind) == Some(Kind::Ident) {
            component = format!(
                "{}.{}{}",
                self.gap(next),
                self.gap(next + 1),
                self.text(next + 1)
            );
            next += 2;
            elem_of_store = Elem::Scalar;
        } else if self.text(next) == "[" {
            let end = self.closing(next)?;
            let inner = self.walk(next + 1, end)?;
            component = format!(
                "{}[{}{inner}{}]",
                self.gap(next),
                self.gap(next + 1),
                self.gap(end)
            );
            next = end + 1;
            elem_of_store = Elem::Scalar;
        }
        let adjacent = |a: usize, b: usize| {
            self.toks
                .get(b)
                .is_some_and(|tb| self.toks[a].end == tb.start)
        };
        let op = self.text(next);
        let is_eq =
            |j: usize| self.text(j) == "=" && !(adjacent(j, j + 1) && self.text(j + 1) == "=");
        if is_eq(next) {
            let end = self.expr_end(next + 1)?;
            let value = self.walk(next + 1, end)?;
            out.push_str(&format!(
                "{access}{component}{}={}{}",
                self.gap(next),
                self.gap(next + 1),
                elem_of_store.narrow(&value)
            ));
            return Ok(end);
        }
        if matches!(op, "+" | "-" | "*" | "/") && adjacent(next, next + 1) && is_eq(next + 1) {
            let end = self.expr_end(next + 2)?;
            let value = self.walk(next + 2, end)?;
            let old = format!("{}{component}", elem.widen(&access));
            out.push_str(&format!(
                "{access}{component}{}={}{}",
                self.gap(next),
                self.gap(next + 2),
                elem_of_store.narrow(&format!("{old} {op} ({value})"))
            ));
            return Ok(end);
        }
        out.push_str(&elem.widen(&access));
        out.push_str(&component);
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shader::{capabilities_of, validate_source, ShaderFamily};

    const DECLS: &str = "@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> idx: array<i32>;
var<workgroup> tile: array<vec4<f32>, 4>;
";

    fn f16_caps() -> naga::valid::Capabilities {
        capabilities_of(wgpu::Features::SHADER_F16)
    }

    /// The f16 twin of `body` as the body of a function over `DECLS`, after checking that the
    /// whole twin validates.
    fn rewrite(body: &str) -> String {
        let src = format!("{DECLS}fn f(i: u32, j: u32) {{\n{body}\n}}\n");
        let out = f16_source("t.wgsl", &src, &[]).unwrap();
        validate_source("t.wgsl", &out, f16_caps()).unwrap_or_else(|e| panic!("{e}\n{out}"));
        let start = out.find("{\n").unwrap() + 2;
        let end = out.rfind("\n}").unwrap();
        out[start..end].to_string()
    }

    #[test]
    fn tensors_are_declared_f16_and_everything_else_keeps_its_type() {
        let out = f16_source("t.wgsl", &format!("{DECLS}fn f() {{}}\n"), &[]).unwrap();
        let expected = "enable f16;
@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<f16>;
@group(0) @binding(2) var<storage, read_write> x4: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> idx: array<i32>;
var<workgroup> tile: array<vec4<f32>, 4>;
fn f() {}
";
        assert_eq!(out, expected);
    }

    #[test]
    fn loads_widen_to_f32() {
        assert_eq!(rewrite("let v = x[i] * 2.0;"), "let v = f32(x[i]) * 2.0;");
        assert_eq!(
            rewrite("let v = x4[i] + x4 [ j ];"),
            "let v = vec4<f32>(x4[i]) + vec4<f32>(x4 [ j ]);"
        );
    }

    #[test]
    fn a_component_of_a_vec4_load_is_taken_from_the_widened_vector() {
        assert_eq!(
            rewrite("let s = x4[i].x + dot(x4[i].xy, vec2<f32>(1.0)) + x4[j][2];"),
            "let s = vec4<f32>(x4[i]).x + dot(vec4<f32>(x4[i]).xy, vec2<f32>(1.0)) + vec4<f32>(x4[j])[2];"
        );
    }

    #[test]
    fn stores_narrow_to_f16() {
        assert_eq!(
            rewrite("x[i] = 1.0 + x[j];"),
            "x[i] = f16(1.0 + f32(x[j]));"
        );
        assert_eq!(
            rewrite("x4[i] =  tile[j] * 0.5 ;"),
            "x4[i] =  vec4<f16>(tile[j] * 0.5) ;"
        );
    }

    #[test]
    fn a_component_store_narrows_the_component() {
        assert_eq!(rewrite("x4[i].y = x[j];"), "x4[i].y = f16(f32(x[j]));");
        assert_eq!(rewrite("x4[i][3] = 0.0;"), "x4[i][3] = f16(0.0);");
    }

    #[test]
    fn a_compound_store_adds_in_f32_and_narrows_once() {
        assert_eq!(
            rewrite("x[i] += 2.0 * x[j];"),
            "x[i] = f16(f32(x[i]) + (2.0 * f32(x[j])));"
        );
        assert_eq!(
            rewrite("x4[i] *= tile[0];"),
            "x4[i] = vec4<f16>(vec4<f32>(x4[i]) * (tile[0]));"
        );
        assert_eq!(
            rewrite("x4[i].w -= 1.0;"),
            "x4[i].w = f16(vec4<f32>(x4[i]).w - (1.0));"
        );
        // `==` compares; it stores nothing.
        assert_eq!(
            rewrite("if (x[i] == x[j]) { x[i] /= 2.0; }"),
            "if (f32(x[i]) == f32(x[j])) { x[i] = f16(f32(x[i]) / (2.0)); }"
        );
    }

    #[test]
    fn indices_are_rewritten_too() {
        assert_eq!(
            rewrite("x[idx[i]] = x[u32(idx[j])] + x[u32(x[j])];"),
            "x[idx[i]] = f16(f32(x[u32(idx[j])]) + f32(x[u32(f32(x[j]))]));"
        );
        assert_eq!(
            rewrite("for (var k = 0u; k < 4u; x[k] += 1.0) { }"),
            "for (var k = 0u; k < 4u; x[k] = f16(f32(x[k]) + (1.0))) { }"
        );
    }

    #[test]
    fn comments_are_left_alone() {
        let src = format!(
            "// x[0] = 1.0; the header\n{DECLS}fn f(i: u32) {{\n    // x[i] += 1.0;\n    \
             let v = /* x[i] */ x[i]; // x4[i]\n}}\n"
        );
        let out = f16_source("t.wgsl", &src, &[]).unwrap();
        assert!(
            out.starts_with("enable f16;\n// x[0] = 1.0; the header\n"),
            "{out}"
        );
        assert!(out.contains("    // x[i] += 1.0;\n"), "{out}");
        assert!(
            out.contains("let v = /* x[i] */ f32(x[i]); // x4[i]\n"),
            "{out}"
        );
    }

    #[test]
    fn only_whole_names_are_tensors() {
        let body = "let a = max(f32(p.x), 0.0) + f32(0x1u) + f32(idx[i]) + 1.5e-3f;
let x4x = vec4<u32>(1u).x + p.w;
var xx = tile[i].x;";
        assert_eq!(rewrite(body), body);
    }

    #[test]
    fn locals_and_parameters_hide_a_tensor_of_the_same_name() {
        let src = format!(
            "{DECLS}struct S {{ x: f32, x4: u32 }}
fn g(x: f32) -> f32 {{ return x * 2.0; }}
fn f(i: u32) -> f32 {{
    let x4 = tile[i];
    for (var x = 0u; x < 4u; x++) {{ }}
    if (i > 0u) {{ let x = x[i]; return x; }}
    return x4.x + x[i];
}}
fn h(i: u32) -> vec4<f32> {{ return x4[i]; }}
"
        );
        let out = f16_source("t.wgsl", &src, &[]).unwrap();
        validate_source("t.wgsl", &out, f16_caps()).unwrap_or_else(|e| panic!("{e}\n{out}"));
        let expected = "struct S { x: f32, x4: u32 }
fn g(x: f32) -> f32 { return x * 2.0; }
fn f(i: u32) -> f32 {
    let x4 = tile[i];
    for (var x = 0u; x < 4u; x++) { }
    if (i > 0u) { let x = f32(x[i]); return x; }
    return x4.x + f32(x[i]);
}
fn h(i: u32) -> vec4<f32> { return vec4<f32>(x4[i]); }
";
        assert!(out.ends_with(expected), "{out}");
    }

    #[test]
    fn array_length_is_kept_and_other_uses_are_refused_with_their_line() {
        assert_eq!(
            rewrite("let n = arrayLength(&x) + arrayLength( &x4 );"),
            "let n = arrayLength(&x) + arrayLength( &x4 );"
        );
        let line = DECLS.lines().count() + 3;
        for bad in [
            "let q = &x;",
            "let q = &x[0];",
            "let q = g(x);",
            "let q = x;",
        ] {
            let src = format!("{DECLS}fn f(i: u32) {{\n    let v = 1.0;\n    {bad}\n}}\n");
            let err = f16_source("t.wgsl", &src, &[]).unwrap_err();
            assert!(err.starts_with(&format!("t.wgsl:{line}: ")), "{bad}: {err}");
            assert!(err.contains('x'), "{err}");
        }
        let err =
            f16_source("t.wgsl", &format!("{DECLS}fn f() {{ let v = x[0; }}"), &[]).unwrap_err();
        assert!(err.contains("unclosed ["), "{err}");
    }

    /// The families with f16 twins: all but the optimizer (f32 master weights and slots),
    /// softmax (the loss) and the casts.
    fn converted() -> impl Iterator<Item = ShaderFamily> {
        ShaderFamily::ALL.into_iter().filter(|f| f.has_half_twin())
    }

    #[test]
    fn every_converted_family_validates_with_the_same_entry_points() {
        for family in converted() {
            let file = family.file();
            let features = if family == ShaderFamily::ReduceSubgroup {
                wgpu::Features::SUBGROUP
            } else {
                wgpu::Features::empty()
            };
            let half = f16_source(file, family.source(), family.kept_f32())
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(half.contains("<f16>"), "{file} has no f16 tensor");
            let full = validate_source(file, family.source(), capabilities_of(features)).unwrap();
            let twin = validate_source(
                file,
                &half,
                capabilities_of(features | wgpu::Features::SHADER_F16),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                validate_source(file, &half, capabilities_of(features)).is_err(),
                "{file}'s twin validates without f16"
            );
            let mut names: Vec<_> = full.entries.keys().collect();
            let mut twin_names: Vec<_> = twin.entries.keys().collect();
            names.sort();
            twin_names.sort();
            assert_eq!(names, twin_names, "{file}");
            for (entry, a) in &full.entries {
                let b = &twin.entries[entry];
                assert_eq!(a.workgroup_size, b.workgroup_size, "{file}::{entry}");
                assert_eq!(a.bindings, b.bindings, "{file}::{entry}");
                assert_eq!(a.uniform, b.uniform, "{file}::{entry}");
            }
            assert_eq!(full.workgroup_bytes, twin.workgroup_bytes, "{file}");
        }
    }

    #[test]
    fn only_lines_that_use_a_tensor_change() {
        for family in converted() {
            let (file, src) = (family.file(), family.source());
            let half = f16_source(file, src, &[]).unwrap();
            let (arrays, _) = storage_tensors(src, &lex(src), &[]);
            let lines: Vec<&str> = half.lines().collect();
            assert_eq!(lines[0], "enable f16;");
            assert_eq!(lines.len() - 1, src.lines().count(), "{file}");
            for (n, (a, b)) in src.lines().zip(&lines[1..]).enumerate() {
                let uses = |name: &&str| {
                    let toks = lex(a);
                    toks.iter().any(|t| &a[t.start..t.end] == *name)
                };
                assert!(
                    a == *b || arrays.keys().any(uses),
                    "{file}:{}: {a}\nbecame {b}",
                    n + 1
                );
            }
        }
    }
}
