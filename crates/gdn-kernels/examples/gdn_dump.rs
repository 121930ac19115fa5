//! Writes a few GDN problems, the CPU oracle's answer and both GPU backends'
//! answers as raw little-endian files plus `cases.json`, for the FLA Triton
//! cross-check (`checks/gpu/fla_crosscheck.py`).
//!
//! Run: `cargo run --release -p gdn-kernels --example gdn_dump -- <dir>`

use std::io::Write;
use std::path::Path;

use gdn_kernels::{BackendRequest, GdnGeometry, GdnPrefill};
use gdn_kernels_testkit::{gpu_stream, Problem};

fn write_f32(path: &Path, v: &[f32]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for x in v {
        f.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: gdn_dump <dir>")?;
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    let Some(stream) = gpu_stream() else {
        return Ok(());
    };
    let cases: &[(&str, usize, usize, &[usize], bool)] = &[
        ("r1_mixed", 16, 16, &[128, 1, 1000], true),
        ("r2_single", 16, 32, &[512], false),
        ("r2_mixed", 16, 32, &[300, 700, 64], true),
        ("r3_mixed", 16, 48, &[65, 2048], true),
    ];
    let mut meta = vec![];
    for (i, &(name, hq, hv, lens, init)) in cases.iter().enumerate() {
        let g = GdnGeometry {
            num_qk_heads: hq,
            num_v_heads: hv,
            head_dim: 128,
        };
        let p = Problem::random(500 + i as u64, g, lens, init);
        let f = |x: &[half::bf16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        write_f32(&dir.join(format!("{name}.q.f32")), &f(&p.q))?;
        write_f32(&dir.join(format!("{name}.k.f32")), &f(&p.k))?;
        write_f32(&dir.join(format!("{name}.v.f32")), &f(&p.v))?;
        write_f32(&dir.join(format!("{name}.alpha.f32")), &p.alpha)?;
        write_f32(&dir.join(format!("{name}.beta.f32")), &p.beta)?;
        if let Some(s) = &p.initial_state {
            write_f32(&dir.join(format!("{name}.init.f32")), s)?;
        }
        let want = p.reference();
        write_f32(&dir.join(format!("{name}.oracle_out.f32")), &want.output)?;
        write_f32(
            &dir.join(format!("{name}.oracle_state.f32")),
            &want.final_state,
        )?;
        for request in [BackendRequest::FlashInfer, BackendRequest::Portable] {
            let mut op = GdnPrefill::new(stream.clone(), g, request)?;
            let (out, state) = p.run_on(&mut op, &stream)?;
            write_f32(&dir.join(format!("{name}.{}_out.f32", op.backend())), &out)?;
            write_f32(
                &dir.join(format!("{name}.{}_state.f32", op.backend())),
                &state,
            )?;
        }
        meta.push(format!(
            "{{\"name\": \"{name}\", \"hq\": {hq}, \"hv\": {hv}, \"cu_seqlens\": {:?}, \"init\": {init}, \"scale\": {}}}",
            p.cu_seqlens, p.scale
        ));
    }
    std::fs::write(dir.join("cases.json"), format!("[{}]\n", meta.join(",\n")))?;
    eprintln!("wrote {} cases to {}", cases.len(), dir.display());
    Ok(())
}
