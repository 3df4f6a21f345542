pub fn bench(_a: BenchArgs) -> hubnorm::Result<()> { Ok(()) }
#[derive(Debug, clap::Args)] pub struct BenchArgs {}
