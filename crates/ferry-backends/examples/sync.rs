//! `ferry sync SRC DST` (dirs, `s3://b/prefix`, `host:path`) through the library: `-- SRC DST`.
use ferry_backends::{AnyStore, Backends, Location, Opts, Settings};
use ferry_engine::{report::Quiet, Engine, Mode, Options, Stats};

fn store(reg: &Backends, arg: &str) -> Result<AnyStore, Box<dyn std::error::Error>> {
    let root = reg.root_of(&Location::parse(arg.as_ref()))?;
    let opts = Opts {
        jobs: 8,
        lazy_meta: true,
        walk: false,
    };
    Ok(reg.open(&root, &opts)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let reg = Backends::new(Settings::default());
    let (src, dst) = (store(&reg, &args[1])?, store(&reg, &args[2])?);
    let opts = Options {
        mode: Mode::Sync,
        jobs: 8,
        ..Options::default()
    };
    let summary = Engine::new(&src, &dst, &opts, &Stats::default(), &Quiet).run_tree()?;
    println!("{summary:?}");
    std::process::exit(i32::from(summary.errors > 0))
}
