//! Arguments from JS, checked: every refusal is an exception whose message names the argument
//! and says what was wrong in JS's words (`the string "64"`, `1.5`, `-1n`), never Rust's debug
//! form of a `JsValue`.
use devalloc::DevicePtr;
use wasm_bindgen::prelude::*;

/// A JS exception with `message`.
pub(crate) fn error(message: String) -> JsValue {
    JsError::new(&message).into()
}

/// `value` as a JS user would write it: `4294967312`, `1.5`, `NaN`, `-1n`, `the string "64"`.
pub(crate) fn describe(value: &JsValue) -> String {
    if let Some(n) = value.as_f64() {
        return number(n);
    }
    if let Some(s) = value.as_string() {
        return format!("the string {s:?}");
    }
    if value.is_bigint() {
        let text = js_sys::BigInt::from(value.clone()).to_string(10).map(String::from);
        return format!("{}n", text.unwrap_or_else(|_| "?".into()));
    }
    if let Some(b) = value.as_bool() {
        return b.to_string();
    }
    if value.is_undefined() {
        return "undefined".into();
    }
    if value.is_null() {
        return "null".into();
    }
    if js_sys::Array::is_array(value) {
        return "an array".into();
    }
    if value.is_function() {
        return "a function".into();
    }
    "an object".into()
}

/// A JS number as JS prints it (integers without a fraction; `NaN`, `Infinity`).
pub(crate) fn number(n: f64) -> String {
    if n.is_nan() {
        "NaN".into()
    } else if n.is_infinite() {
        if n > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{n}")
    }
}

/// `value` as a count of `unit` (bytes, floats, events): a non-negative whole number that fits
/// in this build's `usize`.
pub(crate) fn count(value: &JsValue, name: &str, unit: &str) -> Result<usize, JsValue> {
    let Some(n) = value.as_f64() else {
        return Err(error(format!("{name} must be a number of {unit}, got {}", describe(value))));
    };
    if n.is_nan() {
        return Err(error(format!("{name} must be a number of {unit}, got NaN")));
    }
    if n < 0.0 {
        return Err(error(format!("{name} must not be negative, got {}", number(n))));
    }
    if n.is_infinite() {
        return Err(too_large(name, &number(n), unit));
    }
    if n.fract() != 0.0 {
        return Err(error(format!("{name} must be a whole number of {unit}, got {}", number(n))));
    }
    // Past 2^53 a JS number no longer holds every integer: it cannot be a byte count either.
    if n > usize::MAX as f64 || !js_sys::Number::is_safe_integer(value) {
        return Err(too_large(name, &number(n), unit));
    }
    usize::try_from(n as u64).map_err(|_| too_large(name, &number(n), unit))
}

/// The refusal of a count past what this build can hold.
pub(crate) fn too_large(name: &str, got: &str, unit: &str) -> JsValue {
    error(format!("{name} is too large: {got} {unit}; at most {} on wasm32", usize::MAX))
}

/// `value` as a device address: a BigInt from 0n to 2n**64n - 1n.
pub(crate) fn address(value: &JsValue, name: &str) -> Result<DevicePtr, JsValue> {
    if !value.is_bigint() {
        return Err(error(format!(
            "{name} must be a BigInt device address (as allocate returns, e.g. 4096n), got {}",
            describe(value)
        )));
    }
    u64::try_from(value.clone())
        .map(DevicePtr::new)
        .map_err(|_| error(format!("{name} must be from 0n to 2n**64n - 1n, got {}", describe(value))))
}
