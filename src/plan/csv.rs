//! MiniMalloc's CSV format: `id,lower,upper,size` per buffer (live from step `lower` up to, not
//! including, `upper`), and `id,lower,upper,size,offset` for a placement. Other columns are
//! ignored; the header names the columns, in any order.

use std::collections::HashSet;
use std::fmt::Write as _;

use super::TensorLife;
use crate::error::{Error, Result};

/// A planning problem read from CSV: each buffer's id and lifetime, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    /// The buffers' ids, as the file gives them.
    pub ids: Vec<String>,
    /// The buffers' sizes and lifetimes (`last` = `upper - 1`).
    pub tensors: Vec<TensorLife>,
}

impl Instance {
    /// Reads `text` (the file `name`, for messages). Bad input (missing columns, a row that is
    /// short or not numbers, `lower >= upper`, a zero or negative size, a duplicate id, totals
    /// past 64 bits) is an [`Error::InvalidArgument`] that names the file and the line.
    pub fn from_csv(name: &str, text: &str) -> Result<Instance> {
        let bad = |line: usize, why: String| Error::invalid_argument(format!("{name}:{line}: {why}"));
        // A spreadsheet may start the file with a byte-order mark.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines =
            text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty());
        let Some((hline, header)) = lines.next() else {
            return Err(bad(1, "empty: expected a header `id,lower,upper,size`".into()));
        };
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        let col = |want: &str| {
            cols.iter().position(|c| c.eq_ignore_ascii_case(want)).ok_or_else(|| {
                bad(
                    hline,
                    format!("no `{want}` column in the header (MiniMalloc's is `id,lower,upper,size`)"),
                )
            })
        };
        let (id_at, lower_at, upper_at, size_at) = (col("id")?, col("lower")?, col("upper")?, col("size")?);
        let mut out = Instance::default();
        let mut seen = HashSet::new();
        let mut total: u64 = 0;
        for (line, row) in lines {
            let fields: Vec<&str> = row.split(',').map(str::trim).collect();
            let field = |at: usize, what: &str| {
                fields
                    .get(at)
                    .copied()
                    .ok_or_else(|| bad(line, format!("missing `{what}` ({} fields)", fields.len())))
            };
            let number = |at: usize, what: &str| -> Result<u64> {
                let text = field(at, what)?;
                text.parse::<u64>().map_err(|_| match text.parse::<i128>() {
                    Ok(n) if n < 0 => bad(line, format!("`{what}` is negative: {text}")),
                    Ok(_) => bad(line, format!("`{what}` does not fit in 64 bits: {text}")),
                    Err(_) => bad(line, format!("`{what}` is not a whole number: {text:?}")),
                })
            };
            let id = field(id_at, "id")?;
            let (lower, upper, size) =
                (number(lower_at, "lower")?, number(upper_at, "upper")?, number(size_at, "size")?);
            if lower >= upper {
                return Err(bad(line, format!("buffer {id}: lower {lower} is not below upper {upper}")));
            }
            if size == 0 {
                return Err(bad(line, format!("buffer {id}: size 0")));
            }
            if !seen.insert(id.to_string()) {
                return Err(bad(line, format!("buffer {id} appears twice")));
            }
            total =
                total.checked_add(size).ok_or_else(|| bad(line, "the sizes add up past 64 bits".into()))?;
            out.ids.push(id.to_string());
            out.tensors.push(TensorLife { size, first: lower, last: upper - 1 });
        }
        Ok(out)
    }

    /// The placement as MiniMalloc writes it: `id,lower,upper,size,offset`, one row per buffer.
    pub fn to_csv(&self, offsets: &[u64]) -> String {
        let mut out = String::from("id,lower,upper,size,offset\n");
        for ((id, t), o) in self.ids.iter().zip(&self.tensors).zip(offsets) {
            let _ = writeln!(out, "{id},{},{},{},{o}", t.first, t.last + 1, t.size);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_minimalloc_and_writes_it_back() {
        let text = "id,lower,upper,size\n0,0,4,100\n7,2,3,5\n";
        let inst = Instance::from_csv("t.csv", text).unwrap();
        assert_eq!(inst.ids, ["0", "7"]);
        assert_eq!(inst.tensors[0], TensorLife { size: 100, first: 0, last: 3 });
        assert_eq!(inst.to_csv(&[0, 100]), "id,lower,upper,size,offset\n0,0,4,100,0\n7,2,3,5,100\n");
        // A byte-order mark, Windows line ends, columns in another order and an offset column
        // are fine.
        assert_eq!(
            Instance::from_csv("b.csv", "\u{feff}id,lower,upper,size\r\n0,0,4,100\r\n").unwrap(),
            Instance { ids: vec!["0".into()], tensors: vec![TensorLife { size: 100, first: 0, last: 3 }] }
        );
        let other = Instance::from_csv("u.csv", "size,upper,lower,id,offset\n8,9,1,a,0\n").unwrap();
        assert_eq!(other.tensors[0], TensorLife { size: 8, first: 1, last: 8 });
    }

    #[test]
    fn bad_rows_are_refused_with_the_file_and_line() {
        let cases = [
            ("", "t.csv:1: empty"),
            ("id,lower,size\n0,1,2\n", "t.csv:1: no `upper` column"),
            ("id,lower,upper,size\n0,0,4\n", "t.csv:2: missing `size`"),
            ("id,lower,upper,size\n0,0,4,100\n1,5,5,1\n", "t.csv:3: buffer 1: lower 5 is not below upper 5"),
            ("id,lower,upper,size\n0,9,4,100\n", "t.csv:2: buffer 0: lower 9 is not below upper 4"),
            ("id,lower,upper,size\n0,0,4,0\n", "t.csv:2: buffer 0: size 0"),
            ("id,lower,upper,size\n0,0,4,-3\n", "t.csv:2: `size` is negative"),
            ("id,lower,upper,size\n0,0,4,x\n", "t.csv:2: `size` is not a whole number"),
            ("id,lower,upper,size\n0,0,4,1\n\n0,1,2,3\n", "t.csv:4: buffer 0 appears twice"),
            ("id,lower,upper,size\n0,0,4,99999999999999999999\n", "t.csv:2: `size` does not fit in 64 bits"),
            (
                "id,lower,upper,size\n0,0,4,18446744073709551615\n1,0,4,1\n",
                "t.csv:3: the sizes add up past 64 bits",
            ),
        ];
        for (text, want) in cases {
            let e = Instance::from_csv("t.csv", text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
