//! The templates of a system description: the placeholders a command or a pointer may use,
//! the checks on them, and filling them in (shell-quoted where a shell reads the result).

pub(super) fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// The `{name}` placeholders of a template.
pub(super) fn placeholders(template: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close)
                if after[..close]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
                    && close > 0 =>
            {
                out.push(&after[..close]);
                rest = &after[close + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

pub(super) fn check_placeholders(
    template: &str,
    allowed: &[&str],
) -> std::result::Result<(), String> {
    match placeholders(template)
        .into_iter()
        .find(|p| !allowed.contains(p))
    {
        Some(bad) => Err(format!(
            "unknown placeholder {{{bad}}} (here: {})",
            allowed
                .iter()
                .map(|p| format!("{{{p}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None => Ok(()),
    }
}

/// A shell command's placeholders must stand outside quotes: [`fill_shell`] quotes each value
/// itself, so `'{input}'` would pass the quotes on to the program (and an input with a quote in
/// it would end them).
pub(super) fn check_unquoted(command: &str) -> std::result::Result<(), String> {
    // The quoting state of `sh` before each byte: single quotes, double quotes, backslashes.
    let (mut single, mut double, mut escaped) = (false, false, false);
    for (at, c) in command.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '{' if single || double => {
                if let Some(name) = placeholders(&command[at..]).first()
                    && command[at..].starts_with(&format!("{{{name}}}"))
                {
                    return Err(format!(
                        "{{{name}}} stands inside quotes: racecert quotes each value for the shell \
                         itself (an input with spaces or quotes stays one argument), so write \
                         {{{name}}} without quotes around it"
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A template's `input` or `output` must be an RFC 6901 JSON pointer: `""` (the whole body) or
/// `/` before each key and array index, `~` only in `~0` (a `~`) and `~1` (a `/` in a key). The
/// error names the pointer the value probably means ([`suggest_pointer`]).
pub(super) fn check_pointer(pointer: &str) -> std::result::Result<(), String> {
    let mut chars = pointer.chars();
    let mut escapes_ok = true;
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            escapes_ok = false;
        }
    }
    if (pointer.is_empty() || pointer.starts_with('/')) && escapes_ok {
        return Ok(());
    }
    Err(format!(
        "{pointer:?} is not a JSON pointer (RFC 6901: \"\" for the whole body, or \"/\" before \
         each key and array index, as in \"/choices/0/text\"; a \"~\" in a key is written \"~0\", \
         a \"/\" \"~1\"): did you mean {:?}?",
        suggest_pointer(pointer)
    ))
}

/// The JSON pointer a dotted or bracketed path means (`choices[0].message.content` ->
/// `/choices/0/message/content`, `$.result["text"]` -> `/result/text`, `result/text` ->
/// `/result/text`), or, for a pointer whose only fault is a bare `~`, that pointer escaped.
pub(super) fn suggest_pointer(path: &str) -> String {
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    let path = path.trim();
    if path.starts_with('/') {
        let mut fixed = String::new();
        let mut chars = path.chars().peekable();
        while let Some(c) = chars.next() {
            fixed.push(c);
            if c == '~' && !matches!(chars.peek(), Some('0' | '1')) {
                fixed.push('0');
            }
        }
        return fixed;
    }
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '.' | '/' => keys.push(std::mem::take(&mut key)),
            '[' => {
                keys.push(std::mem::take(&mut key));
                let inside: String = chars.by_ref().take_while(|c| *c != ']').collect();
                let inside = inside.trim();
                let unquoted = ['"', '\'']
                    .iter()
                    .find_map(|q| inside.strip_prefix(*q)?.strip_suffix(*q))
                    .unwrap_or(inside);
                keys.push(unquoted.to_owned());
            }
            c => key.push(c),
        }
    }
    keys.push(key);
    keys.iter()
        .filter(|key| !key.is_empty())
        .map(|key| format!("/{}", escape(key)))
        .collect()
}

/// Fills `{name}` placeholders of `template` from `values`; others are left as they are.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.to_owned();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

/// Fills the placeholders of a command run with `sh -c`, each value quoted for the shell when it
/// needs it (`submit.py {request_id} {input}` keeps an input with spaces as one argument).
pub fn fill_shell(template: &str, values: &[(&str, &str)]) -> String {
    let quoted: Vec<(&str, String)> = values
        .iter()
        .map(|(name, value)| {
            // A NUL byte cannot be passed in an argument at all (the only thing quoting
            // refuses): it is dropped.
            let value = value.replace('\0', "");
            let quoted =
                shlex::try_quote(&value).map_or_else(|_| String::new(), |q| q.into_owned());
            (*name, quoted)
        })
        .collect();
    let values: Vec<(&str, &str)> = quoted.iter().map(|(n, v)| (*n, v.as_str())).collect();
    fill(template, &values)
}
