//! Compile units: the table's declarative units turned into nvcc command
//! lines, cached by content, run with parallelism bounded by memory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use gdn_lock::{ArtifactKind, ArtifactTable, Links, Sha256Hex, Unit, UnitOutput};

use crate::dsl::{self, DslEnv};
use crate::error::{GenError, Result};
use crate::files;
use crate::process::{hermetic, run};
use crate::stage::staged_source;
use crate::toolkit::Toolkit;

/// Which program a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Nvcc,
    /// The interpreter of the DSL environment, running the export driver.
    Python,
}

/// One compiler invocation and the files it leaves behind.
#[derive(Debug, Clone)]
pub struct Step {
    pub program: Program,
    pub unit: String,
    pub target: Option<String>,
    /// Arguments after `nvcc`, relative to the staging directory, except the
    /// output/keep paths, which live in the unit's cache directory.
    pub args: Vec<String>,
    pub peak_memory_mib: u64,
}

/// Outputs of one unit, in its cache directory.
pub struct UnitOutputs {
    pub unit: Unit,
    /// The unit's cache entry (`<unit cache>/units/<name>-<key>`).
    pub dir: PathBuf,
    /// Whether the entry was compiled by this run (otherwise reused).
    pub compiled_now: bool,
}

impl UnitOutputs {
    pub fn object(&self) -> PathBuf {
        self.dir.join(format!("{}.o", self.unit.name))
    }
    pub fn cubin(&self, target: &str) -> PathBuf {
        self.dir.join(format!("{}.{target}.cubin", self.unit.name))
    }
    /// A DSL export output (`<variant>.h`, `.o`, `.cubin`).
    pub fn dsl_file(&self, variant: &str, ext: &str) -> PathBuf {
        self.dir.join("out").join(format!("{variant}.{ext}"))
    }

    /// What the unit puts in the bundle: (bundle path, file in the cache
    /// entry, kind), in a fixed order.
    pub fn files(&self) -> Vec<(String, PathBuf, ArtifactKind)> {
        let unit = &self.unit;
        let mut files = vec![];
        if unit.dsl.is_some() {
            let target = &unit.targets[0];
            for v in unit.dsl_variants() {
                files.push((
                    unit.dsl_cubin_path(v, target),
                    self.dsl_file(v, "cubin"),
                    ArtifactKind::DeviceCubin,
                ));
                files.push((
                    Unit::dsl_object_path(v),
                    self.dsl_file(v, "o"),
                    ArtifactKind::DslObject,
                ));
                files.push((
                    Unit::dsl_header_path(v),
                    self.dsl_file(v, "h"),
                    ArtifactKind::DslHeader,
                ));
            }
            return files;
        }
        for t in &unit.targets {
            files.push((unit.cubin_path(t), self.cubin(t), ArtifactKind::DeviceCubin));
        }
        if unit.output == UnitOutput::HostObject {
            files.push((unit.object_path(), self.object(), ArtifactKind::HostObject));
        }
        files
    }
}

/// The cache entry of `unit` under `key`.
pub fn entry_dir(cache: &Path, unit: &Unit, key: &Sha256Hex) -> PathBuf {
    cache
        .join("units")
        .join(format!("{}-{}", unit.name, &key.as_str()[..16]))
}

fn gencode(target: &str) -> String {
    let arch = target.trim_start_matches("sm_");
    format!("-gencode=arch=compute_{arch},code=sm_{arch}")
}

/// The flags that make nvcc's output independent of where it runs (see
/// docs/reproducibility.md): a fixed original-source name for cudafe++'s
/// module ID, and a keep-dir so the host object names no PID-stamped temp file.
fn determinism_flags(unit: &Unit, keep_dir: &Path) -> Vec<String> {
    let mut flags = vec![];
    if unit.source.ends_with(".cu") {
        flags.push("-Xcudafe".into());
        flags.push(format!("--orig_src_path_name={}.cu", unit.name));
        flags.push("--keep".into());
        flags.push("--keep-dir".into());
        flags.push(keep_dir.display().to_string());
    }
    flags
}

pub fn steps_for(unit: &Unit, host_cxx: &str, site: &Path, out_dir: &Path) -> Vec<Step> {
    let src = staged_source(&unit.source);
    if unit.output == UnitOutput::DslObjects {
        return vec![Step {
            program: Program::Python,
            unit: unit.name.clone(),
            target: unit.targets.first().cloned(),
            args: dsl::export_args(unit, &src, site, &out_dir.join("out")),
            peak_memory_mib: unit.peak_memory_mib,
        }];
    }
    let mut common = vec!["-ccbin".to_string(), host_cxx.to_string()];
    common.extend(unit.flags.iter().cloned());
    for inc in &unit.includes {
        common.push(format!("-I{inc}"));
    }
    for inc in &unit.system_includes {
        common.push("-isystem".into());
        common.push(inc.clone());
    }
    match unit.output {
        UnitOutput::HostObject => {
            let keep = out_dir.join("keep");
            let mut args = common;
            args.extend(unit.targets.iter().map(|t| gencode(t)));
            args.extend(determinism_flags(unit, &keep));
            args.extend(["-c".into(), src, "-o".into()]);
            args.push(
                out_dir
                    .join(format!("{}.o", unit.name))
                    .display()
                    .to_string(),
            );
            vec![Step {
                program: Program::Nvcc,
                unit: unit.name.clone(),
                target: None,
                args,
                peak_memory_mib: unit.peak_memory_mib,
            }]
        }
        UnitOutput::DslObjects => unreachable!("handled above"),
        UnitOutput::Cubin => unit
            .targets
            .iter()
            .map(|t| {
                let mut args = common.clone();
                args.push(gencode(t));
                args.extend([
                    "-Xcudafe".into(),
                    format!("--orig_src_path_name={}.cu", unit.name),
                ]);
                args.extend(["-cubin".into(), src.clone(), "-o".into()]);
                args.push(
                    out_dir
                        .join(format!("{}.{t}.cubin", unit.name))
                        .display()
                        .to_string(),
                );
                Step {
                    program: Program::Nvcc,
                    unit: unit.name.clone(),
                    target: Some(t.clone()),
                    args,
                    peak_memory_mib: unit.peak_memory_mib,
                }
            })
            .collect(),
    }
}

/// Compiles every unit that is not already cached; returns the outputs in
/// table order. DSL exports run first: their headers are copied into the
/// staging tree (`dsl.header_dir`) for the nvcc units that include them.
pub fn compile_all(
    table: &ArtifactTable,
    stage_dir: &Path,
    cache: &Path,
    tk: &Toolkit,
    dsl: Option<&DslEnv>,
    keys: &[Sha256Hex],
    jobs: usize,
) -> Result<Vec<UnitOutputs>> {
    let mut outputs = vec![];
    let mut pending: [Vec<(Step, PathBuf)>; 2] = [vec![], vec![]];
    let step = "compile the units";
    for (unit, key) in table.units.iter().zip(keys) {
        let dir = entry_dir(cache, unit, key);
        let compiled_now = !dir.join(".complete").exists();
        if compiled_now {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("keep")).map_err(|e| GenError::io(step, &dir, e))?;
            let site = match (unit.dsl.is_some(), dsl) {
                (true, None) => {
                    return Err(GenError::refused(
                        step,
                        format!("unit {} needs the DSL environment", unit.name),
                    ))
                }
                (_, d) => d.map(|d| d.site.clone()).unwrap_or_default(),
            };
            for step in steps_for(unit, &tk.host_cxx, &site, &dir) {
                let phase = (step.program == Program::Nvcc) as usize;
                pending[phase].push((step, dir.clone()));
            }
        }
        outputs.push(UnitOutputs {
            unit: unit.clone(),
            dir,
            compiled_now,
        });
    }
    let [dsl_steps, nvcc_steps] = pending;
    run_bounded(dsl_steps.clone(), stage_dir, tk, dsl, jobs)?;
    for (step, dir) in &dsl_steps {
        let o = outputs
            .iter()
            .find(|o| o.unit.name == step.unit)
            .expect("a step belongs to a unit");
        dsl::check_outputs(&o.unit, &dir.join("out"))?;
        mark_complete(dir)?;
    }
    if let Some(cfg) = &table.dsl {
        let headers = stage_dir.join(&cfg.header_dir);
        std::fs::create_dir_all(&headers)
            .map_err(|e| GenError::io("stage the DSL headers", &headers, e))?;
        for o in outputs.iter().filter(|o| o.unit.dsl.is_some()) {
            for v in o.unit.dsl_variants() {
                files::copy(
                    "stage the DSL headers",
                    &o.dsl_file(v, "h"),
                    &headers.join(format!("{v}.h")),
                    Links::Refuse,
                )?;
            }
        }
    }
    run_bounded(nvcc_steps.clone(), stage_dir, tk, dsl, jobs)?;
    for (_, dir) in &nvcc_steps {
        mark_complete(dir)?;
    }
    for o in &outputs {
        collect_kept_cubin(o)?;
    }
    Ok(outputs)
}

/// A unit's cache entry is used only once it is marked complete.
fn mark_complete(dir: &Path) -> Result<()> {
    let done = dir.join(".complete");
    std::fs::write(&done, b"").map_err(|e| GenError::io("mark a compiled unit complete", &done, e))
}

/// For host-object units nvcc's own cubin is kept in keep/; copy it to the
/// unit's canonical cubin name so bundle assembly treats all units alike.
fn collect_kept_cubin(o: &UnitOutputs) -> Result<()> {
    if o.unit.output != UnitOutput::HostObject || o.unit.targets.is_empty() {
        return Ok(());
    }
    let step = format!("collect the cubin of unit {}", o.unit.name);
    if o.unit.targets.len() != 1 {
        return Err(GenError::refused(
            step,
            "a host-object unit must have at most one target",
        ));
    }
    let dest = o.cubin(&o.unit.targets[0]);
    if dest.exists() {
        return Ok(());
    }
    let keep = o.dir.join("keep");
    let cubins: Vec<_> = std::fs::read_dir(&keep)
        .map_err(|e| GenError::io(&step, &keep, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cubin"))
        .collect();
    match cubins.as_slice() {
        [one] => files::copy(&step, one, &dest, Links::Refuse).map(|_| ()),
        _ => Err(GenError::refused(
            step,
            format!(
                "expected one kept cubin in {}, found {}",
                keep.display(),
                cubins.len()
            ),
        )),
    }
}

/// Memory the compiles may use at once: 80% of MemAvailable.
fn memory_budget_mib() -> u64 {
    files::read_text(
        "read the available memory",
        Path::new("/proc/meminfo"),
        Links::Follow,
        1 << 20,
    )
    .ok()
    .and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
    })
    .map(|kb| kb / 1024 * 8 / 10)
    .unwrap_or(8192)
}

/// Runs steps in waves: each wave holds at most `jobs` steps whose declared
/// peak memory fits the budget (always at least one).
fn run_bounded(
    mut steps: Vec<(Step, PathBuf)>,
    stage_dir: &Path,
    tk: &Toolkit,
    dsl: Option<&DslEnv>,
    jobs: usize,
) -> Result<()> {
    let total = steps.len();
    let budget = memory_budget_mib();
    steps.sort_by_key(|(s, _)| std::cmp::Reverse(s.peak_memory_mib));
    let mut done = 0;
    while !steps.is_empty() {
        let mut wave = vec![];
        let mut mem = 0;
        let mut i = 0;
        while i < steps.len() && wave.len() < jobs.max(1) {
            if wave.is_empty() || mem + steps[i].0.peak_memory_mib <= budget {
                mem += steps[i].0.peak_memory_mib;
                wave.push(steps.remove(i));
            } else {
                i += 1;
            }
        }
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = wave
                .iter()
                .map(|(step, dir)| {
                    done += 1;
                    let n = done;
                    scope.spawn(move || run_step(step, dir, stage_dir, tk, dsl, n, total))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("compile thread panicked"))
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
    }
    Ok(())
}

fn run_step(
    step: &Step,
    dir: &Path,
    stage_dir: &Path,
    tk: &Toolkit,
    dsl: Option<&DslEnv>,
    n: usize,
    total: usize,
) -> Result<()> {
    let what = match &step.target {
        Some(t) => format!("{} ({t})", step.unit),
        None => step.unit.clone(),
    };
    let verb = match step.program {
        Program::Nvcc => "compiling",
        Program::Python => "exporting (CuTe DSL)",
    };
    eprintln!("gdn-gen: [{n}/{total}] {verb} {what} ...");
    let start = Instant::now();
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| GenError::io(format!("compile {what}"), &tmp, e))?;
    let mut cmd = match (step.program, dsl) {
        (Program::Nvcc, _) => {
            let mut cmd = Command::new(tk.nvcc());
            hermetic(&mut cmd, &tmp);
            cmd
        }
        (Program::Python, Some(env)) => dsl::command(env, &tmp),
        (Program::Python, None) => {
            return Err(GenError::refused(
                format!("compile {what}"),
                "no DSL environment",
            ))
        }
    };
    cmd.current_dir(stage_dir).args(&step.args);
    run(&format!("compile {what}"), &mut cmd)?;
    eprintln!(
        "gdn-gen: [{n}/{total}] {what} done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
