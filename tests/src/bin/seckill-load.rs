//! `seckill-load`: the flash-sale load simulator (see `tests/src/load/`).
//! Thin main: parse the command line and the configuration, run, map the
//! result to an exit code (0 invariants hold, 1 violated, 2 could not run,
//! 64 bad command line).
#![forbid(unsafe_code)]

use seckill_tests::load;

use std::process::ExitCode;

fn main() -> ExitCode {
    let config = match seckill_common::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("seckill-load: {e}");
            return ExitCode::from(2);
        }
    };
    let now_s = seckill_common::now_ms() / 1000;
    let opts = match load::cli::parse(std::env::args_os().skip(1), config.listen, now_s) {
        Ok(load::cli::Parsed::Help) => {
            println!("{}", load::cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(load::cli::Parsed::Run(o)) => o,
        Err(e) => {
            eprintln!("seckill-load: {e}\n\n{}", load::cli::USAGE);
            return ExitCode::from(64);
        }
    };
    match load::run(&opts, &config) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("seckill-load: {e}");
            ExitCode::from(2)
        }
    }
}
