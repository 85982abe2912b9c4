pub fn bench(_q: bool, _o: &std::path::Path, _p: usize) -> anyhow::Result<()> {
    anyhow::bail!("todo")
}
