//! `ferry sync SRC DST` (dirs, `s3://b/prefix`, `host:path`) through the library: `-- SRC DST`.
use ferry_backends::{open, shell_root, AnyStore, Location, Opts, Root, S3Config};
use ferry_engine::{report::Quiet, Engine, Mode, Options, Stats};

fn store(arg: &str) -> Result<AnyStore, Box<dyn std::error::Error>> {
    let root = match Location::parse(arg.as_ref()) {
        Location::S3(u) => Root::S3(Box::new(S3Config::from_url(&u, None)?)),
        Location::Local(p) => Root::Local(std::path::absolute(p)?),
        Location::Shell { text, host, path } => shell_root(&text, &host, &path)?,
    };
    let opts = Opts {
        jobs: 8,
        lazy_meta: true,
    };
    Ok(open(&root, &opts)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (src, dst) = (store(&args[1])?, store(&args[2])?);
    let opts = Options {
        mode: Mode::Sync,
        jobs: 8,
        ..Options::default()
    };
    let summary = Engine::new(&src, &dst, &opts, &Stats::default(), &Quiet).run_tree()?;
    println!("{summary:?}");
    std::process::exit(i32::from(summary.errors > 0))
}
