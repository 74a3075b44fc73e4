//! The contract's integer expressions: the one evaluator of the whole project (the Python oracle
//! receives resolved contracts and evaluates nothing).
//!
//! Grammar (integers only; `/` must divide exactly):
//!
//! ```text
//! expr   := term (('+' | '-') term)*
//! term   := unary (('*' | '/') unary)*
//! unary  := '-' unary | atom
//! atom   := INT | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
//! FUNC   := ceil_div | floor_div | min | max
//! NAME   := a dim, repeat, config key (dotted paths walk nested objects), `layer`,
//!           `last:REPEAT` (the repeat's last index) or `each:LIST` (the list element)
//! ```

/// What looking a name up gives: `Ok(Some(value))`, `Ok(None)` for a name that is not known, or
/// an error when the name is known but its value cannot be used (a config key holding a string,
/// a fraction or a number beyond the bound): that message is the evaluation's error.
pub type Lookup = std::result::Result<Option<i64>, String>;

/// Evaluate `expr`, looking names up with `vars`. The error names the expression and what is
/// wrong with it (an unknown name, a name whose value is unusable, an inexact division, an
/// overflow, a syntax error).
pub fn eval_expr(expr: &str, vars: &dyn Fn(&str) -> Lookup) -> std::result::Result<i64, String> {
    let toks = tokenize(expr)?;
    if toks.is_empty() {
        return Err(format!("empty expression '{expr}'"));
    }
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        expr,
        vars,
    };
    let v = p.expr()?;
    match p.toks.get(p.pos) {
        None => Ok(v),
        Some(t) => Err(format!("unexpected '{}' in '{expr}'", t.text())),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Name(String),
    Op(char),
}

impl Tok {
    fn text(&self) -> String {
        match self {
            Tok::Int(n) => n.to_string(),
            Tok::Name(s) => s.clone(),
            Tok::Op(c) => c.to_string(),
        }
    }
}

fn tokenize(s: &str) -> std::result::Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if "+-*/(),".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let t: String = chars[start..i].iter().collect();
            let n = t
                .parse::<i64>()
                .map_err(|_| format!("integer '{t}' out of range in '{s}'"))?;
            out.push(Tok::Int(n));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_.:".contains(chars[i]))
            {
                // `last: name` / `each: name`: spaces after the colon belong to the name.
                if chars[i] == ':' {
                    i += 1;
                    while i < chars.len() && chars[i] == ' ' {
                        i += 1;
                    }
                    continue;
                }
                i += 1;
            }
            let t: String = chars[start..i].iter().filter(|c| **c != ' ').collect();
            out.push(Tok::Name(t));
        } else {
            return Err(format!("unexpected character '{c}' in '{s}'"));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    expr: &'a str,
    vars: &'a dyn Fn(&str) -> Lookup,
}

type R = std::result::Result<i64, String>;

impl Parser<'_> {
    fn peek_op(&self) -> Option<char> {
        match self.toks.get(self.pos) {
            Some(Tok::Op(c)) => Some(*c),
            _ => None,
        }
    }

    fn expect(&mut self, c: char) -> std::result::Result<(), String> {
        if self.peek_op() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{c}' in '{}'", self.expr))
        }
    }

    fn overflow(&self) -> String {
        format!("'{}' overflows", self.expr)
    }

    fn expr(&mut self) -> R {
        self.chain(['+', '-'], Self::term)
    }

    fn term(&mut self) -> R {
        self.chain(['*', '/'], Self::unary)
    }

    /// `operand (op operand)*` for `op` in `ops`, folded left to right by [`Parser::apply`].
    fn chain(&mut self, ops: [char; 2], operand: fn(&mut Self) -> R) -> R {
        let mut acc = operand(self)?;
        while let Some(op) = self.peek_op().filter(|c| ops.contains(c)) {
            self.pos += 1;
            let rhs = operand(self)?;
            acc = self.apply(op, acc, rhs)?;
        }
        Ok(acc)
    }

    /// `acc op rhs` (`+ - * /`): an overflow or an inexact division is an error.
    fn apply(&self, op: char, acc: i64, rhs: i64) -> R {
        match op {
            '+' => acc.checked_add(rhs).ok_or_else(|| self.overflow()),
            '-' => acc.checked_sub(rhs).ok_or_else(|| self.overflow()),
            '*' => acc.checked_mul(rhs).ok_or_else(|| self.overflow()),
            _ => {
                if rhs == 0 {
                    return Err(format!("'{}': {acc} is not divisible by 0", self.expr));
                }
                // `None` for `i64::MIN % -1` (it overflows): an error, never a panic.
                match acc.checked_rem(rhs) {
                    Some(0) => acc.checked_div(rhs).ok_or_else(|| self.overflow()),
                    Some(_) => Err(format!("'{}': {acc} is not divisible by {rhs}", self.expr)),
                    None => Err(self.overflow()),
                }
            }
        }
    }

    fn unary(&mut self) -> R {
        if self.peek_op() == Some('-') {
            self.pos += 1;
            return self.unary()?.checked_neg().ok_or_else(|| self.overflow());
        }
        self.atom()
    }

    fn atom(&mut self) -> R {
        let Some(tok) = self.toks.get(self.pos).cloned() else {
            return Err(format!("dangling operator in '{}'", self.expr));
        };
        self.pos += 1;
        match tok {
            Tok::Int(n) => Ok(n),
            Tok::Op('(') => {
                let v = self.expr()?;
                self.expect(')')?;
                Ok(v)
            }
            Tok::Op(c) => Err(format!("unexpected '{c}' in '{}'", self.expr)),
            Tok::Name(name) if self.peek_op() == Some('(') => {
                self.pos += 1;
                let mut args = vec![self.expr()?];
                while self.peek_op() == Some(',') {
                    self.pos += 1;
                    args.push(self.expr()?);
                }
                self.expect(')')?;
                self.call(&name, &args)
            }
            Tok::Name(name) => match (self.vars)(&name) {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(format!(
                    "'{name}' is not a known dim, repeat or config key (in '{}')",
                    self.expr
                )),
                Err(why) => Err(format!("{why} (in '{}')", self.expr)),
            },
        }
    }

    fn call(&self, f: &str, args: &[i64]) -> R {
        let two = |what: &str| -> std::result::Result<(i64, i64), String> {
            match args {
                [a, b] => Ok((*a, *b)),
                _ => Err(format!(
                    "{what} takes 2 arguments, got {} (in '{}')",
                    args.len(),
                    self.expr
                )),
            }
        };
        match f {
            "ceil_div" | "floor_div" => {
                let (a, b) = two(f)?;
                if b <= 0 {
                    return Err(format!("{f} by {b} (in '{}')", self.expr));
                }
                let q = a.div_euclid(b);
                Ok(if f == "ceil_div" && a.rem_euclid(b) != 0 {
                    q + 1
                } else {
                    q
                })
            }
            "min" | "max" if !args.is_empty() => {
                let it = args.iter().copied();
                Ok(if f == "min" { it.min() } else { it.max() }.unwrap_or_default())
            }
            _ => Err(format!(
                "unknown function '{f}' (known: ceil_div, floor_div, min, max) in '{}'",
                self.expr
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::eval_expr;

    fn cfg(t: &str) -> super::Lookup {
        Ok(match t {
            "d_model" => Some(384),
            "heads" => Some(6),
            "n.layers" => Some(4),
            "last:enc" => Some(3),
            "min" => Some(i64::MIN),
            "minus_one" => Some(-1),
            "zero" => Some(0),
            _ => None,
        })
    }

    #[test]
    fn arithmetic_and_precedence() {
        for (expr, want) in [
            ("d_model / heads", 64),
            ("2 * d_model", 768),
            ("n.layers / 2 - 1", 1),
            ("1 + 2 * 3 - 4", 3),
            ("(1 + 2) * 3", 9),
            ("-heads + 10", 4),
            ("2 - -1", 3),
            ("last: enc - 1", 2),
        ] {
            assert_eq!(eval_expr(expr, &cfg), Ok(want), "{expr}");
        }
    }

    #[test]
    fn functions() {
        for (expr, want) in [
            ("ceil_div(7, 2)", 4),
            ("ceil_div(8, 2)", 4),
            ("floor_div(7, 2)", 3),
            ("ceil_div(d_model, 5) * 2", 154),
            ("min(heads, 3, 9)", 3),
            ("max(heads, n.layers + 9)", 13),
        ] {
            assert_eq!(eval_expr(expr, &cfg), Ok(want), "{expr}");
        }
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = |s: &str| eval_expr(s, &cfg).unwrap_err();
        assert!(e("d_model / 5").contains("not divisible"));
        assert!(e("missing_key").contains("missing_key"));
        assert!(e("d_model +").contains("dangling"));
        assert!(e("(1 + 2").contains("expected ')'"));
        assert!(e("1 2").contains("unexpected '2'"));
        assert!(e("sqrt(4)").contains("unknown function 'sqrt'"));
        assert!(e("ceil_div(4)").contains("takes 2 arguments"));
        assert!(e("ceil_div(4, 0)").contains("ceil_div by 0"));
        assert!(e("").contains("empty"));
        assert!(e("3 $ 4").contains("unexpected character '$'"));
        assert!(e("9223372036854775807 + 1").contains("overflows"));
        // i64::MIN / -1 and i64::MIN % -1 overflow: an error, never a panic.
        assert!(e("min / minus_one").contains("overflows"));
        assert!(e("d_model / zero").contains("not divisible by 0"));
        assert!(e("ceil_div(min, 1) * minus_one").contains("overflows"));
        // A known name whose value is unusable: the lookup's message, with the expression.
        let bad = eval_expr("2 * d_model", &|t| {
            if t == "d_model" {
                Err("config.json key 'd_model' is a string \"64\"".into())
            } else {
                Ok(None)
            }
        })
        .unwrap_err();
        assert!(
            bad.contains("'d_model' is a string") && bad.contains("2 * d_model"),
            "{bad}"
        );
    }
}
