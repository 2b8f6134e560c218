//! Tests of system descriptions: files and builders, their errors at `file:line:col`, the
//! presets' defaults and the placeholders a command may use.

use super::*;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

#[test]
fn dramatiq_recovery_is_its_heartbeat_then_a_maintenance_pass() {
    let path = example("examples/dramatiq-worker/safe.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let system = System::parse(&text, &path).unwrap();
    let options = system.dramatiq().unwrap();
    // Every command runs maintenance: the heartbeat timeout, one command, a second's margin.
    assert_eq!(options.recovery(), Duration::from_secs(6));
    let (bound, named) = system.recovery_bound();
    assert_eq!(bound, Duration::from_secs(6));
    assert!(named.contains("heartbeat_timeout_ms = 4000"), "{named}");
    assert_eq!(
        system
            .settings_values()
            .iter()
            .find(|(n, _)| *n == "maintenance_chance"),
        Some(&("maintenance_chance", "1000000".to_owned()))
    );
    // A message's queue defaults to Dramatiq's own.
    let Submit::Preset { queue, .. } = &system.submit else {
        panic!("a preset submission");
    };
    assert_eq!(queue, "default");
    // Dramatiq's defaults: a 0.1% chance a command does maintenance, so a dead worker's
    // message waits for thousands of commands: refused, at the framework's line.
    let defaults = text.replace("maintenance_chance = 1000000", "maintenance_chance = 1000");
    let err = System::parse(&defaults, &path).unwrap_err().to_string();
    assert!(
        err.contains("safe.toml:6:") && err.contains("higher maintenance_chance"),
        "{err}"
    );
    // The actors' time limit, declared: a placeholder, and the time-limit fault; one the
    // HTTP client's timeout would beat is refused, naming both.
    assert_eq!(
        system
            .settings_values()
            .iter()
            .find(|(n, _)| *n == "time_limit_ms"),
        Some(&("time_limit_ms", "18000".to_owned()))
    );
    assert!(
        crate::system::preset::system_faults(&system).contains(&crate::fault::FaultKind::TimeLimit)
    );
    let late = text.replace("time_limit_ms = 18000", "time_limit_ms = 23000");
    let err = System::parse(&late, &path).unwrap_err().to_string();
    assert!(
        err.contains("safe.toml:6:")
            && err.contains("time_limit_ms = 23000")
            && err.contains("model_ms = 25000"),
        "{err}"
    );
    let undeclared = text.replace("time_limit_ms = 18000", "");
    let err = System::parse(&undeclared, &path).unwrap_err().to_string();
    assert!(err.contains("unknown placeholder {time_limit_ms}"), "{err}");
    let retrying = example("examples/dramatiq-worker/retry-at-once.toml");
    let retrying = System::load(&retrying).unwrap();
    assert!(
        !crate::system::preset::system_faults(&retrying)
            .contains(&crate::fault::FaultKind::TimeLimit)
    );
    let missing = text.replace("[dramatiq]", "[unused]");
    let err = System::parse(&missing, &path).unwrap_err().to_string();
    assert!(err.contains("unused"), "{err}");
    let none: String = text
        .lines()
        .take_while(|line| *line != "[dramatiq]")
        .map(|line| format!("{line}\n"))
        .collect::<String>()
        .replace("DRAMATIQ_NAMESPACE = \"{namespace}\"", "")
        .replace("HEARTBEAT_TIMEOUT_MS = \"{heartbeat_timeout_ms}\"", "")
        .replace("MAINTENANCE_CHANCE = \"{maintenance_chance}\"", "")
        .replace("TIME_LIMIT_MS = \"{time_limit_ms}\"", "");
    let err = System::parse(&none, &path).unwrap_err().to_string();
    assert!(err.contains("needs a [dramatiq] table"), "{err}");
}

#[test]
fn the_shipped_examples_load() {
    for file in [
        "examples/celery-worker/naive.toml",
        "examples/celery-worker/fenced.toml",
        "examples/celery-worker/locked.toml",
        "examples/apalis-worker/naive.toml",
        "examples/apalis-worker/fenced.toml",
        "examples/dramatiq-worker/naive.toml",
        "examples/dramatiq-worker/safe.toml",
        "examples/dramatiq-worker/lost.toml",
    ] {
        let system = System::load(&example(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(system.versions.len(), 2, "{file}");
        assert!(system.results.terminal.contains(&"SUCCEEDED".to_owned()));
    }
    let apalis = System::load(&example("examples/apalis-worker/naive.toml")).unwrap();
    assert_eq!(apalis.start.setup.as_deref(), Some("cargo build --locked"));
    assert!(apalis.place("start.setup").ends_with("naive.toml:8:9"));
    let celery = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
    assert_eq!(celery.framework, Framework::Celery);
    assert_eq!(celery.model, ModelApi::OpenaiCompletions);
    assert_eq!(celery.celery().unwrap().visibility_timeout_s, 5.0);
    assert!(
        celery
            .start
            .requirements
            .as_ref()
            .unwrap()
            .ends_with("examples/celery-worker/requirements.txt")
    );
}

fn celery_file(results: &str) -> String {
    format!(
        "name = \"x\"\nframework = \"celery\"\n[start]\ncommand = \"run {{worker_id}}\"\n\
         [versions]\nv1 = \"a\"\n[submit]\ntask = \"t\"\n{results}\n\
         [model]\napi = \"racecert\"\n[celery]\nvisibility_timeout_s = 5\n"
    )
}

#[test]
fn a_fencing_column_is_read_and_a_bad_one_names_its_line() {
    let path = Path::new("sys.toml");
    let results =
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
    let text = format!(
        "{}[fencing]\ncolumn = \"epoch\"\norder = \"increasing\"\n",
        celery_file(results)
    );
    let system = System::parse(&text, path).unwrap();
    assert_eq!(
        system.fencing,
        Some(crate::contract::fencing::Fencing {
            column: "epoch".into(),
            order: crate::contract::fencing::FenceOrder::Increasing,
        })
    );
    let text = format!(
        "{}[fencing]\ncolumn = \"epoch\"\norder = \"newest\"\n",
        celery_file(results)
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:21:9"), "{err}");
    assert!(err.contains("increasing") && err.contains("token"), "{err}");
    let text = format!(
        "{}[fencing]\ncolumn = \"epoch; --\"\norder = \"token\"\n",
        celery_file(results)
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:20:10"), "{err}");
    assert!(err.contains("not a plain SQL identifier"), "{err}");
}

#[test]
fn the_files_settings_are_placeholders_and_one_of_a_missing_table_is_unknown() {
    let path = Path::new("sys.toml");
    let results =
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
    let text = celery_file(results).replace(
        "command = \"run {worker_id}\"\n",
        "command = \"run {worker_id} --vt {visibility_timeout_s}\"\n[start.env]\nMODEL_TIMEOUT_S = \"{model_timeout_s}\"\n",
    ) + "[timeouts]\nmodel_ms = 7500\n";
    let system = System::parse(&text, path).unwrap();
    let values = system.settings_values();
    assert!(
        values.contains(&("visibility_timeout_s", "5".into())),
        "{values:?}"
    );
    assert!(
        values.contains(&("model_timeout_s", "7.5".into())),
        "{values:?}"
    );
    let text = text.replace("{visibility_timeout_s}", "{heartbeat_s}");
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("unknown placeholder {heartbeat_s}"), "{err}");
    assert!(err.contains("{visibility_timeout_s}"), "{err}");
}

#[test]
fn the_recovery_bound_is_the_longer_of_the_presets_and_the_files_and_is_capped() {
    let path = Path::new("sys.toml");
    let results =
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
    let system = System::parse(&celery_file(results), path).unwrap();
    let (bound, source) = system.recovery_bound();
    assert_eq!(bound, Duration::from_secs(5));
    assert!(source.contains("visibility_timeout_s = 5"), "{source}");
    let text = format!("{}[timeouts]\nrecovery_ms = 45000\n", celery_file(results));
    let system = System::parse(&text, path).unwrap();
    assert_eq!(system.model_timeout, Duration::from_secs(30));
    assert_eq!(
        system.recovery_bound(),
        (
            Duration::from_secs(45),
            "[timeouts] recovery_ms = 45000".into()
        )
    );
    let text = format!("{}[timeouts]\nrecovery_ms = 900000\n", celery_file(results));
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:20:15"), "{err}");
    assert!(err.contains("above 300000 ms"), "{err}");
}

#[test]
fn errors_name_file_line_and_column() {
    let path = Path::new("sys.toml");
    let text = celery_file(
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = []\noutput = \"o\"",
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:13:12"), "{err}");
    assert!(err.contains("`terminal` is empty"), "{err}");

    let text = celery_file(
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"\ncolour = 1",
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:15:1"), "{err}");
    assert!(err.contains("colour"), "{err}");

    let text = celery_file(
        "[results]\ntable = \"t; DROP\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"",
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:10:9"), "{err}");

    let text = celery_file(
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"",
    )
    .replace("run {worker_id}", "run {worker}");
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:4:11"), "{err}");
    assert!(err.contains("unknown placeholder {worker}"), "{err}");

    let results =
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
    let text = format!("{}[keys]\nlease = \"lock:{{id}}\"\n", celery_file(results));
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:20:9"), "{err}");
    assert!(err.contains("unknown placeholder {id}"), "{err}");
    let text = format!(
        "{}[keys]\ncache = \"cache:{{version}}:{{version}}\"\n",
        celery_file(results)
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:20:9"), "{err}");
    assert!(err.contains("must hold {version} at most once"), "{err}");

    // A variable's bad placeholder is reported at the variable's own line.
    let text = format!(
        "{}[start.env]\nA = \"{{venv}}\"\nB = \"{{worker}}\"\n",
        celery_file(results)
    );
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:21:5"), "{err}");
    assert!(
        err.contains("[start.env] B: unknown placeholder {worker}"),
        "{err}"
    );

    // A placeholder inside quotes in a command.
    let text = celery_file(results).replace("run {worker_id}", "run '{worker_id}'");
    let err = System::parse(&text, path).unwrap_err().to_string();
    assert!(err.contains("sys.toml:4:11"), "{err}");
    assert!(err.contains("{worker_id} stands inside quotes"), "{err}");
}

/// `celery_file` with its `[model]` table's lines (from line 16) replaced by `model`.
fn with_model(model: &str) -> String {
    let results =
        "[results]\ntable = \"t\"\nkey = \"k\"\nstatus = \"s\"\nterminal = [\"A\"]\noutput = \"o\"";
    celery_file(results).replace(
        "[model]\napi = \"racecert\"\n",
        &format!("[model]\n{model}\n"),
    )
}

#[test]
fn model_apis_are_named_and_an_unknown_one_lists_them() {
    let path = Path::new("sys.toml");
    let chat = System::parse(&with_model("api = \"openai-chat\"\nname = \"gpt\""), path).unwrap();
    assert_eq!(
        (chat.model, chat.model_name.as_str()),
        (ModelApi::OpenaiChat, "gpt")
    );
    let err = System::parse(&with_model("api = \"openai\""), path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sys.toml:15:1"), "{err}");
    assert!(
        err.contains(
            "unknown model api \"openai\" (racecert, openai-completions, openai-chat, kserve-v2, template)"
        ),
        "{err}"
    );
}

#[test]
fn template_places_are_json_pointers_checked_at_their_line() {
    let path = Path::new("sys.toml");
    let template = |input: &str, output: &str| {
        with_model(&format!(
            "api = \"template\"\npath = \"/v1/answer\"\ninput = \"{input}\"\noutput = \"{output}\""
        ))
    };
    let good = System::parse(&template("/messages/0/content", "/result/a~1b~0c"), path).unwrap();
    assert_eq!(
        good.model,
        ModelApi::Template {
            path: "/v1/answer".into(),
            input: "/messages/0/content".into(),
            output: "/result/a~1b~0c".into(),
        }
    );
    assert_eq!(good.place("model.input"), "sys.toml:18:9");
    assert_eq!(good.place("model.output"), "sys.toml:19:10");
    // The whole body is a pointer too.
    assert!(System::parse(&template("", ""), path).is_ok());

    let err = System::parse(&template("/text", "choices[0].message.content"), path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "sys.toml:19:10: [model] output \"choices[0].message.content\" is not a JSON pointer (RFC 6901:"
        ),
        "{err}"
    );
    assert!(
        err.ends_with("did you mean \"/choices/0/message/content\"?"),
        "{err}"
    );
    let err = System::parse(&template("inputs.0.text", "/ok"), path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sys.toml:18:9: [model] input \"inputs.0.text\""),
        "{err}"
    );
    assert!(err.ends_with("did you mean \"/inputs/0/text\"?"), "{err}");
    // A pointer whose `~` escapes nothing.
    let err = System::parse(&template("/text", "/a~b"), path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sys.toml:19:10"), "{err}");
    assert!(err.ends_with("did you mean \"/a~0b\"?"), "{err}");
}

#[test]
fn paths_written_other_ways_suggest_their_pointer() {
    for (path, pointer) in [
        ("choices[0].message.content", "/choices/0/message/content"),
        ("$.result.text", "/result/text"),
        ("outputs[0][\"data\"][0]", "/outputs/0/data/0"),
        ("result['a/b']", "/result/a~1b"),
        ("result/text", "/result/text"),
        (" .result ", "/result"),
        ("$", ""),
        ("/a~b~1", "/a~0b~1"),
    ] {
        assert_eq!(suggest_pointer(path), pointer, "{path}");
        assert_eq!(check_pointer(pointer), Ok(()), "{pointer}");
    }
    for bad in ["choices[0].text", "result", "/a~", "/a~2"] {
        assert!(check_pointer(bad).is_err(), "{bad}");
    }
}

#[test]
fn placeholders_in_commands_stand_outside_quotes() {
    for ok in [
        "python submit.py {request_id} {input}",
        "{venv}/bin/python x.py --id={request_id}",
        "echo '{\"k\": 1}' {input}",
        "echo \"it's\" {input}",
        "echo \\' {input}",
    ] {
        assert_eq!(check_unquoted(ok), Ok(()), "{ok}");
    }
    for bad in [
        "python submit.py '{input}'",
        "python submit.py \"{request_id}\"",
        "sh -c 'submit {input}'",
        "echo \"$(x)\" \"{venv}/bin/x\"",
    ] {
        assert!(check_unquoted(bad).is_err(), "{bad}");
    }
}

#[test]
fn values_are_quoted_for_the_shell() {
    let filled = fill_shell(
        "printf '%s|' {request_id} {input}",
        &[
            ("request_id", "req-1"),
            ("input", "a b 'c' \"d\" $HOME `x` \\ ;|&"),
        ],
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&filled)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "req-1|a b 'c' \"d\" $HOME `x` \\ ;|&|",
        "{filled}"
    );
    // A value that needs no quotes is left as it is (`{venv}/bin/celery`).
    assert_eq!(
        fill_shell("{venv}/bin/celery", &[("venv", "/tmp/v-1")]),
        "/tmp/v-1/bin/celery"
    );
}

#[test]
fn keys_reach_the_wire_checks_layout() {
    let system = System::load(&example("examples/celery-worker/locked.toml")).unwrap();
    let matcher = system.keys.matcher();
    assert_eq!(matcher.lease_of("lock:req-1").as_deref(), Some("req-1"));
    assert!(!matcher.has_cache());
    let naive = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
    assert_eq!(naive.keys, KeyLayout::default());
}

#[test]
fn the_builder_runs_the_same_checks() {
    let results = Results {
        table: "inference_results".into(),
        key: "request_id".into(),
        status: "status".into(),
        terminal: vec!["SUCCEEDED".into()],
        output: "output".into(),
        version: None,
        schema: None,
    };
    let built = System::builder("apalis", Framework::Apalis)
        .command("./target/debug/apalis-worker", ".")
        .env("WORKER_NAME", "{worker_id}")
        .version("v1", "model-backend-A")
        .submit_task("inference", &[("request_id", "{request_id}")], "inference")
        .results(results.clone())
        .apalis(ApalisOptions {
            backend: "postgres".into(),
            queue: "inference".into(),
            heartbeat_s: 2.0,
            missed_heartbeats: 3,
        })
        .build()
        .unwrap();
    assert_eq!(
        built.versions,
        vec![("v1".into(), "model-backend-A".into())]
    );
    let err = System::builder("apalis", Framework::Apalis)
        .command("w", ".")
        .version("v1", "a")
        .submit_task("inference", &[], "inference")
        .results(results)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs an [apalis] table"), "{err}");
}

/// The Celery example's `naive.toml`, written with the builder: the same description.
#[test]
fn the_builder_describes_what_the_file_does() {
    let file = System::load(&example("examples/celery-worker/naive.toml")).unwrap();
    let dir = example("examples/celery-worker");
    let mut builder = System::builder("celery-naive", Framework::Celery)
        .command(&file.start.command, dir.join("."))
        .requirements(dir.join("requirements.txt"))
        .ready("{worker_id}@racecert ready.")
        .version("v1", "model-backend-A")
        .version("v2", "model-backend-B")
        .submit_task(
            "tasks.infer_naive",
            &[("request_id", "{request_id}"), ("input", "{input}")],
            "celery",
        )
        .results(Results {
            table: "inference_results".into(),
            key: "request_id".into(),
            status: "status".into(),
            terminal: vec!["SUCCEEDED".into(), "FAILED".into()],
            output: "output".into(),
            version: Some("model_version".into()),
            schema: Some(dir.join("schema.sql")),
        })
        .model(ModelApi::OpenaiCompletions, "inference-model")
        .celery(CeleryOptions {
            visibility_timeout_s: 5.0,
            acks_late: true,
            prefetch_multiplier: 1,
            reject_on_worker_lost: false,
        })
        .model_timeout(Duration::from_secs(15));
    for (name, value) in &file.start.env {
        builder = builder.env(name, value);
    }
    let built = builder.build().unwrap();
    assert_eq!(built.start, file.start);
    assert_eq!(built.versions, file.versions);
    assert_eq!(built.submit, file.submit);
    assert_eq!(built.results, file.results);
    assert_eq!(
        (
            &built.model,
            &built.model_name,
            &built.celery,
            built.model_timeout
        ),
        (
            &file.model,
            &file.model_name,
            &file.celery,
            file.model_timeout
        )
    );
    assert_eq!(built.source, None);
    assert!(built.place("results.output").contains("celery-naive"));
}

#[test]
fn placeholders_fill_and_unknown_ones_are_found() {
    assert_eq!(
        fill("{a}-{b}-{a}", &[("a", "1"), ("b", "2")]),
        "1-2-1".to_owned()
    );
    assert_eq!(placeholders("x {a} {} {B} {c_d}"), vec!["a", "c_d"]);
    assert!(check_placeholders("{venv}/bin/celery", START_PLACEHOLDERS).is_ok());
}
